"""The rollout through the real tritonserver: the real ``router`` model (with
its rollout hooks) in front of four echo orchestrators
(``trtspec.bench.echo_model``; no engine, so requests cost milliseconds):

- ``baseline`` — the fallback, 10 ms a token;
- ``ngram`` — the same text four tokens a round (about 4x faster): route
  ``code``, at the default canary share (5%);
- ``flat`` — slower than the baseline (13 ms a token): route ``flat`` at
  50%, never shown faster, so ``advance`` holds it at its step;
- ``lossy`` — corrupted text at the baseline's pace: route ``lossy`` at 50%,
  whose golden diff sends it back automatically.

The router runs as two processes (``instance_group`` count 2, the spec's
``router.instances``), so everything below holds across them: one request
log both write, metrics per process (label ``router_instance``) that add up, a
change by ``trtspec rollout`` or by either process's golden diff applied by
both, and a route's ``max_concurrency`` counted over both (route ``capped``:
its in-flight file names both processes and ends at zero).

Checked: the default share over 400 requests (the exact ids the hash picks,
and 5% within binomial bounds), one log line per request with every field,
the per-route metric series (histograms included), ``advance`` and
``rollback`` moving the split with no restart and no failed request while
others are in flight, the history, the held variant and the automatic
rollback within a bounded number of golden checks.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.fixtures.router_jobs import add_router, router_job
from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import canary_bucket
from trtspec.bench.client import Job, StreamWorker
from trtspec.bench.echo_model import write_echo_repository
from trtspec.bench.openai_metrics import parse_prometheus
from trtspec.cli.main import cli
from trtspec.runtime.models.rollout_log import FIELDS, TIME_FIELD, read_lines

pytestmark = pytest.mark.slow

PROMPT = "abcdefghijklmnopqrstuvwxyz0123456789"
MAX_TOKENS = 4
ROUTERS = 2  # router processes
# a request's bound: an echo request takes tens of ms, so this is only ever
# reached by a frozen server, which should fail the test soon, not after 30 min
TIMEOUT_S = 20


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    from trtspec.repo import assemble
    from trtspec.serve import Server

    root = tmp_path_factory.mktemp("rollout")
    spec_repo = root / "triton_repo" / "echo"
    repo = write_echo_repository(
        spec_repo,
        {
            "baseline": {"round_ms": 10.0},
            "ngram": {"round_ms": 10.0, "max_accept": 3},
            "flat": {"round_ms": 13.0},
            "lossy": {"round_ms": 10.0, "corrupt": True},
        },
    )
    routes = {
        "code": {"variant": "ngram", "num_draft_tokens": 3, "canary_percent": 5},
        "flat": {"variant": "flat", "canary_percent": 50},
        "lossy": {"variant": "lossy", "canary_percent": 50},
        "capped": {"variant": "ngram", "canary_percent": 100, "max_concurrency": 2},
    }
    add_router(repo, ["baseline", "flat", "lossy", "ngram"], routes, instances=ROUTERS)
    facts = {"speculative": True, "draft_model": None, "num_speculative_tokens": 3}
    config = st.RolloutConfig(
        model="echo-target",
        min_requests=5,
        golden_every=10,
        golden_max_tokens=8,
        # the window's breach rule is unit-tested (tests/unit/test_rollout.py);
        # here only the golden diff may roll a route back: on a loaded two-core
        # machine one stalled request moves a 20-request p95 by several times
        thresholds={"min_speedup": 1.05, "max_p95_regression": 10.0, "max_error_rate": 0.2},
        variants={
            "baseline": {"speculative": False, "draft_model": None, "num_speculative_tokens": None},
            "ngram": facts,
            "flat": facts,
            "lossy": {**facts, "draft_model": "echo-draft"},
        },
        golden={route: [PROMPT] for route in routes},
    )
    (repo / assemble.ROUTER / st.CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    echoes = ("baseline", "flat", "lossy", "ngram")
    models = {name: {"role": "orchestrator", "variant": name, "calls": []} for name in echoes}
    models["router"] = {"role": "router", "calls": list(echoes)}
    manifest = {"schema_version": 1, "spec": "echo", "variants": list(echoes), "models": models}
    (repo / "trtspec-repo.json").write_text(json.dumps(manifest))
    server = Server(repo, log_path=root / "server.log")
    server.start(timeout=120)
    try:
        yield server, repo
    finally:
        # 0, not -9: every model unloaded within the stop's grace (a bench
        # client that cancelled its idle streams kept models live until killed)
        assert server.stop() == 0, server.log_tail(20)
        log = server.log_text()
        assert "Traceback" not in log, log[-4000:]


def _job(route: str, request_id: str) -> Job:
    return router_job(route, request_id, PROMPT, MAX_TOKENS)


def _send_many(url: str, route: str, ids: list[str], workers: int = 4) -> dict[str, Any]:
    """request id -> the final response (an error string on failure).

    At most ``workers`` requests in flight (4: with the background load of
    the advance test, about 150 new streams a second over both routers). Not
    more: tritonserver 2.51's Python backend can deadlock a stub that makes
    decoupled BLS calls at a few hundred new streams a second
    (docs/design/triton-limits.md), and 16 in flight froze a router in CI (two test
    processes on two cores) and here in 2 of 7 runs."""
    out: dict[str, Any] = {}
    lock = threading.Lock()
    todo = list(ids)

    def work() -> None:
        worker = StreamWorker(url, TIMEOUT_S)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    rid = todo.pop()
                outcome = worker.run(_job(route, rid))
                with lock:
                    out[rid] = outcome.error if outcome.error else outcome.final
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return out


def _log(repo: Path, count: int) -> list[dict[str, Any]]:
    """The request log once it holds ``count`` lines (the writer is async)."""
    path = repo / "router" / st.STATE_DIR / st.LOG_FILE
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        lines = read_lines(path)
        if len(lines) >= count:
            return lines
        time.sleep(0.1)
    return read_lines(path)


def _binomial_bounds(n: int, p: float, z: float = 3.29) -> tuple[float, float]:
    """A 99.9% normal-approximation band for a binomial count."""
    sd = math.sqrt(n * p * (1 - p))
    return n * p - z * sd, n * p + z * sd


def test_default_canary_share_log_and_metrics(served) -> None:
    server, repo = served
    ids = [f"share-{i}" for i in range(400)]
    finals = _send_many(server.grpc_url, "code", ids)
    failed = {k: v for k, v in finals.items() if not isinstance(v, dict)}
    assert not failed, list(failed.items())[:3]
    on_variant = sorted(k for k, v in finals.items() if v.get("variant") == "ngram")
    # exactly the ids the hash puts under 5%, and 5% within binomial bounds
    assert on_variant == sorted(i for i in ids if canary_bucket(i) < 500)
    lo, hi = _binomial_bounds(400, 0.05)
    assert lo <= len(on_variant) <= hi, len(on_variant)

    lines = [r for r in _log(repo, 400) if str(r.get("request_id", "")).startswith("share-")]
    assert sorted(r["request_id"] for r in lines) == sorted(ids)  # one line per request
    for r in lines:
        assert list(r) == [*FIELDS, TIME_FIELD], r  # every field, nothing else (no prompt)
        assert r["route"] == "code" and r["model"] == "echo-target" and r["error"] is None
        assert r["completion_tokens"] == MAX_TOKENS and r["prompt_tokens"] == len(PROMPT)
        assert r["ttft_ms"] <= r["latency_ms"] and r["tokens_per_second"] > 0
        assert r["temperature"] == 0.0 and r["fallback"] is False
    canary = [r for r in lines if r["arm"] == "canary"]
    control = [r for r in lines if r["arm"] == "control"]
    assert {r["variant"] for r in canary} == {"ngram"}
    assert {r["variant"] for r in control} == {"baseline"}
    # what each variant reports: ngram drafts 3 a round and accepts all
    assert all(r["draft_tokens"] == 3 and r["accepted_tokens"] == 3 for r in canary)
    assert all(r["speculative"] and r["num_speculative_tokens"] == 3 for r in canary)
    assert all(
        not r["speculative"] and r["num_speculative_tokens"] is None and r["draft_tokens"] == 0
        for r in control
    )

    n_canary = len(canary)
    canary_labels = {"arm": "canary", "route": "code", "variant": "ngram"}
    control_labels = {"arm": "control", "route": "code", "variant": "baseline"}
    # summed over the router processes (each series has its label `router_instance`)
    expected = [
        ("trtspec_requests_total", canary_labels, n_canary),
        ("trtspec_requests_total", control_labels, 400 - n_canary),
        # histograms as counter families (rollout_metrics)
        ("trtspec_latency_seconds_bucket", {**canary_labels, "le": "+Inf"}, n_canary),
        ("trtspec_latency_seconds_bucket", {**canary_labels, "le": "120"}, n_canary),
        ("trtspec_latency_seconds_count", canary_labels, n_canary),
        ("trtspec_ttft_seconds_count", control_labels, 400 - n_canary),
        ("trtspec_generated_tokens_total", canary_labels, n_canary * MAX_TOKENS),
        ("trtspec_draft_tokens_total", canary_labels, n_canary * 3),
        ("trtspec_accepted_tokens_total", canary_labels, n_canary * 3),
        ("trtspec_in_flight", canary_labels, 0),
    ]
    # the router applies its metrics in batches (rollout_metrics): the last
    # requests' updates may come a batch after the first ones'
    metrics = _metrics_with(server, expected)
    for name, labels, value in expected:
        assert _total(metrics, name, labels) == value, (name, labels, metrics[-3000:])
    assert "trtspec_errors_total{" not in metrics  # no request failed
    # every process served a share, under its own label
    served_by = _series(metrics, "trtspec_requests_total", {"route": "code"})
    names = sorted({labels["router_instance"] for labels, _ in served_by})
    assert names == [f"router_0_{i}" for i in range(ROUTERS)], served_by
    assert all(count > 0 for _, count in served_by), served_by
    percents = _series(metrics, "trtspec_canary_percent", {"route": "code", "variant": "ngram"})
    assert percents and {value for _, value in percents} == {5.0}, percents


def _series(page: str, name: str, labels: dict[str, str]) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of ``name`` on a /metrics page whose
    labels include ``labels``."""
    return [
        (have, value)
        for sample, have, value in parse_prometheus(page)
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    ]


def _total(page: str, name: str, labels: dict[str, str]) -> float:
    return sum(value for _, value in _series(page, name, labels))


def _metrics_with(server: Any, expected: list[tuple[str, dict[str, str], float]]) -> str:
    """The /metrics page once every ``(name, labels, total)`` of ``expected``
    adds up (metrics are updated off the request path, in batches), or as it
    is after a deadline."""
    deadline = time.monotonic() + 10
    while True:
        page = urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10)
        text = page.read().decode()
        done = all(_total(text, n, labels) == v for n, labels, v in expected)
        if done or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["rollout", *args], catch_exceptions=False)


def test_advance_and_rollback_move_the_split_without_a_restart(served) -> None:
    server, repo = served
    pid = server.pid
    # enough canary traffic on `code` for a window (from the test above, or now)
    _send_many(server.grpc_url, "code", [f"warm-{i}" for i in range(200)])
    status = _cli("status", str(repo), "--route", "code", "--format", "json")
    assert status.exit_code == 0, status.output
    report = json.loads(status.stdout)["routes"][0]
    assert report["verdict"] == "advance", report

    # requests in flight while the state changes under them
    stop = threading.Event()
    background: list[Any] = []

    def load() -> None:
        i = 0
        while not stop.is_set():
            got = _send_many(server.grpc_url, "code", [f"bg-{i}-{j}" for j in range(4)], 2)
            background.extend(got.values())
            if not all(isinstance(v, dict) for v in got.values()):
                return  # reported below; more would only wait out more timeouts
            i += 1

    def served_at(percent: float) -> None:
        """Until every router process has served `code` at ``percent``, as
        each says on /metrics (a process re-reads the state on a request; the
        background load sends them), within a deadline."""
        instances = [f"router_0_{i}" for i in range(ROUTERS)]
        want = [
            ("trtspec_canary_percent", {"route": "code", "router_instance": name}, percent)
            for name in instances
        ]
        deadline = time.monotonic() + 60
        while True:
            page = _metrics_with(server, want)
            got = {
                labels["router_instance"]: value
                for labels, value in _series(page, "trtspec_canary_percent", {"route": "code"})
            }
            if got == dict.fromkeys(instances, percent):
                return
            assert time.monotonic() < deadline, (percent, got)
            time.sleep(0.2)

    loader = threading.Thread(target=load)
    loader.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not background and loader.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the load is running: its next requests are in flight
        assert background, "the background load got no answer"
        moved = _cli("advance", "code", str(repo), "--why", "window supports it", "--by", "test")
        assert moved.exit_code == 0, moved.output
        assert "5% → 25%" in moved.stdout
        served_at(25.0)
        ids = [f"step25-{i}" for i in range(200)]
        finals = _send_many(server.grpc_url, "code", ids)
        assert sorted(k for k, v in finals.items() if v["variant"] == "ngram") == sorted(
            i for i in ids if canary_bucket(i) < 2500
        )
        back = _cli("rollback", "code", str(repo), "--why", "test", "--by", "test")
        assert back.exit_code == 0, back.output
        served_at(0.0)
        finals = _send_many(server.grpc_url, "code", [f"after-{i}" for i in range(40)])
        assert {v["variant"] for v in finals.values()} == {"baseline"}
    finally:
        stop.set()
        loader.join(timeout=120)
    assert background and all(isinstance(v, dict) for v in background), [
        v for v in background if not isinstance(v, dict)
    ][:3]
    assert server.pid == pid and server.running  # no restart
    actions = [
        (e["route"], e["action"], e["to_percent"], e["who"])
        for e in st.read_history(repo / "router" / st.STATE_DIR)
    ]
    assert ("code", "advance", 25.0, "test") in actions
    assert ("code", "rollback", 0.0, "test") in actions


def test_a_slow_variant_is_held_at_its_step(served) -> None:
    server, repo = served
    finals = _send_many(server.grpc_url, "flat", [f"flat-{i}" for i in range(60)])
    assert all(isinstance(v, dict) for v in finals.values())
    held = _cli("advance", "flat", str(repo))
    assert held.exit_code == 3, held.output
    assert "route 'flat' held at 50%" in held.output
    # shown slower, or (on a noisy machine) merely not shown faster: held either way
    assert re.search(
        r"speedup [0-9.]+x \[[0-9.]+, [0-9.]+\] (not above 1\.05|\(consider rollback\))",
        held.output,
    ), held.output
    state = st.read_state(repo / "router" / st.STATE_DIR / st.STATE_FILE)
    assert state is None or "flat" not in state.routes


def test_a_lossy_variant_is_rolled_back_by_the_golden_diff(served) -> None:
    server, repo = served
    folder = repo / "router" / st.STATE_DIR
    sent = 0
    # golden_every=10: one golden check per 10 requests of the route; the
    # first mismatch rolls it back, so 5 checks' worth of requests is a bound
    while sent < 50:
        _send_many(server.grpc_url, "lossy", [f"lossy-{sent + j}" for j in range(10)])
        sent += 10
        state = st.read_state(folder / st.STATE_FILE)
        if state is not None and state.routes.get("lossy", st.RouteState(50)).status == (
            st.ROLLED_BACK
        ):
            break
        time.sleep(0.5)  # let the golden check of these ten finish
    state = st.read_state(folder / st.STATE_FILE)
    assert state is not None and state.routes["lossy"] == st.RouteState(0.0, st.ROLLED_BACK)
    entry = next(e for e in st.read_history(folder) if e["route"] == "lossy")
    assert entry["who"] == "router (automatic)" and entry["trigger"] == "golden"
    assert entry["variant_output"] != entry["fallback_output"]
    assert entry["fallback_output"] == PROMPT[:8]
    golden = [g for g in read_lines(folder / st.GOLDEN_FILE) if g["route"] == "lossy"]
    assert [g["result"] for g in golden][:1] == ["mismatch"] and len(golden) <= 5
    time.sleep(2 * st.POLL_S)
    finals = _send_many(server.grpc_url, "lossy", [f"after-lossy-{i}" for i in range(20)])
    assert {v["variant"] for v in finals.values()} == {"baseline"}


def test_the_router_processes_share_a_routes_concurrency_limit(served) -> None:
    server, repo = served
    # 24 requests 4 at a time on a route capped at 2 in flight: some go to
    # the fallback, every one answers, and the in-flight file (the count of
    # both processes) names both and is back at zero
    finals = _send_many(server.grpc_url, "capped", [f"capped-{i}" for i in range(24)])
    assert all(isinstance(v, dict) for v in finals.values()), finals
    variants = {v["variant"] for v in finals.values()}
    assert variants == {"ngram", "baseline"}, variants
    files = list((repo / "router" / st.STATE_DIR).glob("in_flight.*.json"))
    assert len(files) == 1, files
    # A router releases a request's place after its final response went out,
    # so the client can read the file a moment before the last release.
    deadline = time.monotonic() + 10
    while True:
        counts = json.loads(files[0].read_text())
        if all(n == 0 for slot in counts.values() for n in slot.values()):
            break
        assert time.monotonic() < deadline, counts  # a place never released
        time.sleep(0.05)
    # a slot per process, named by its instance and pid
    assert sorted(s.rpartition("/")[0] for s in counts) == [
        f"router_0_{i}" for i in range(ROUTERS)
    ], counts


def _bucketed(prefix: str, lo: int, hi: int) -> str:
    """A request id whose canary bucket lies in [lo, hi) (hundredths of %)."""
    return next(f"{prefix}-{i}" for i in range(10**6) if lo <= canary_bucket(f"{prefix}-{i}") < hi)


def _page(server: Any) -> str:
    return (
        urllib.request.urlopen(f"http://{server.metrics_url}/metrics", timeout=10).read().decode()
    )


def test_a_hostile_state_keeps_the_route_on_its_last_good_arm(served) -> None:
    """Issue 44: route ``flat`` is put at 30% by a good state, then each
    hostile state of tests/fixtures/rollout_states.py replaces it. Three
    request ids per state tell the outcomes apart: one under 30% (the
    variant; the fallback had -50 or -inf applied), one from 30% to 50% (the
    fallback; the variant had the base table's 50% come back) and one above
    50% (the fallback; the variant had 150, 1e308, inf or a 400-digit share
    applied). Every request answers on its last good arm, the router
    processes log the refusal (one line each) and count it, and ``trtspec
    rollout status`` exits 1 naming the problem."""
    from tests.fixtures.rollout_states import HOSTILE, write_good, write_hostile

    server, repo = served
    folder = repo / "router" / st.STATE_DIR
    path = folder / st.STATE_FILE
    saved = path.read_bytes() if path.exists() else None
    digest = st.routing_digest(repo / "router" / "routing.json")
    expect = {
        _bucketed("low", 0, 3000): "flat",
        _bucketed("mid", 3000, 5000): "baseline",
        _bucketed("high", 5000, 10000): "baseline",
    }
    refused_before = _total(_page(server), "trtspec_rollout_state_refused_total", {})
    said: dict[str, str] = {}
    try:
        write_good(folder, digest, "flat", 30)
        for name in ("good", *HOSTILE):
            if name != "good":
                said[name] = write_hostile(folder, name, digest, "flat")
            time.sleep(2 * st.POLL_S)
            for attempt in range(2):  # each router process reads it at its next request
                finals = _send_many(server.grpc_url, "flat", [f"{r}-{attempt}" for r in expect], 3)
                got = {rid.rpartition("-")[0]: v for rid, v in finals.items()}
                assert all(isinstance(v, dict) for v in got.values()), (name, got)
                assert {r: v["variant"] for r, v in got.items()} == expect, (name, got)
            if name == "good":
                continue
            status = CliRunner().invoke(cli, ["rollout", "status", str(repo)])
            assert status.exit_code == 1, (name, status.output)
            assert status.stderr.startswith(f"Error: {said[name]}\n"), (name, status.stderr)
            assert "Traceback" not in status.output
    finally:
        path.unlink(missing_ok=True)
        if saved is not None:
            path.write_bytes(saved)
        time.sleep(2 * st.POLL_S)
    log = server.log_text()
    for name, words in said.items():
        lines = [ln for ln in log.splitlines() if f"rollout: refused {words}" in ln]
        assert 1 <= len(lines) <= ROUTERS, (name, lines)  # once per process that read it
        assert "; keeping the last good state" in lines[0], lines[0]
    deadline = time.monotonic() + 10
    while True:  # metrics go out in batches
        refused = _total(_page(server), "trtspec_rollout_state_refused_total", {})
        if refused - refused_before >= len(HOSTILE) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(HOSTILE) <= refused - refused_before <= ROUTERS * len(HOSTILE), refused


def test_made_up_routes_add_no_label_values(served) -> None:
    """Issue 44: 200 requests with routes not in the routing table are
    counted under one fixed ``route`` label value, not a series each."""
    server, _ = served
    routes = [f"made-up-{i}" for i in range(200)]
    out: dict[str, Any] = {}
    lock = threading.Lock()

    def work(mine: list[str]) -> None:
        worker = StreamWorker(server.grpc_url, TIMEOUT_S)
        try:
            for route in mine:
                outcome = worker.run(_job(route, f"{route}-r"))
                with lock:
                    out[route] = outcome.error or outcome.final
        finally:
            worker.close()

    threads = [threading.Thread(target=work, args=(routes[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(out) == 200 and all(isinstance(v, dict) for v in out.values()), out
    assert {v["variant"] for v in out.values()} == {"baseline"}  # the default variant
    want = [("trtspec_requests_total", {"route": "(other)"}, 200.0)]
    page = _metrics_with(server, want)
    assert _total(page, "trtspec_requests_total", {"route": "(other)"}) == 200, page[-2000:]
    labelled = {labels.get("route") for _, labels, _ in parse_prometheus(page)}
    assert not {r for r in labelled if r and r.startswith("made-up")}, sorted(labelled)[:5]
