"""The rollout without a server: the default canary split over many request
ids, the spec's ramp, the request log (fields, rotation, dropping instead of
blocking), the routing state (atomic change, history, the digest guard, the
router's re-read), the live window's verdicts, the router-side bookkeeping
(log line, automatic rollback on a window breach) and ``trtspec rollout``
on a repository folder with a written log. The served behaviour is in
tests/integration/test_rollout_served.py."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import Choice, RouteRule, RoutingTable, choose
from trtspec.catalogue import DEFAULT_CANARY_PERCENT
from trtspec.cli.main import cli
from trtspec.rollout.compare import ADVANCE, HOLD, ROLLBACK, compare
from trtspec.runtime.models.rollout_live import Live, Tracked
from trtspec.runtime.models.rollout_log import FIELDS, TIME_FIELD, LineWriter, read_lines
from trtspec.runtime.models.rollout_metrics import SERIES

ROOT = Path(__file__).resolve().parents[2]
THRESHOLDS = {"min_speedup": 1.05, "max_p95_regression": 0.10, "max_error_rate": 0.01}


def test_the_default_canary_share_is_five_percent_within_binomial_bounds() -> None:
    from trtspec.spec.schema import Rollout

    assert Rollout().canary_percent == DEFAULT_CANARY_PERCENT == 5
    assert Rollout().steps == [5, 25, 50, 100]
    table = RoutingTable(routes={"code": RouteRule("ngram", canary_percent=5.0)})
    n = 4000
    ids = [f"req-{i}" for i in range(n)]
    picked = [choose(table, "code", i).variant for i in ids]
    share = picked.count("ngram")
    sd = math.sqrt(n * 0.05 * 0.95)
    assert abs(share - n * 0.05) < 3.29 * sd, share  # 99.9% band
    assert picked == [choose(table, "code", i).variant for i in ids]  # deterministic


@pytest.mark.parametrize(
    "steps",
    [[5, 50, 25, 100], [5, 25, 50], [5, 5, 100]],
)
def test_a_ramp_that_does_not_rise_to_100_is_refused(tmp_path: Path, steps: list[int]) -> None:
    from trtspec.errors import SpecError
    from trtspec.spec import load_spec

    spec = tmp_path / "s.yaml"
    spec.write_text(
        "name: s\nbackend: reference\ntarget: {model: ./m, family: llama}\n"
        f"rollout: {{steps: {steps}}}\n"
    )
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    text = str(err.value)
    assert "rollout.steps" in text and "must rise strictly and end at 100" in text, text


# -- the request log -----------------------------------------------------------


def test_the_log_rotates_at_its_size_and_keeps_its_backups(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    writer = LineWriter(path, max_bytes=4096, backups=2)
    for i in range(300):
        assert writer.write({"i": i, "pad": "x" * 40})
    writer.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == [
        "requests.jsonl",
        "requests.jsonl.1",
        "requests.jsonl.2",
        "requests.jsonl.lock",
    ]
    assert all((tmp_path / f).stat().st_size <= 4096 for f in files)
    got = [r["i"] for r in read_lines(path)]
    assert got == list(range(300 - len(got), 300))  # oldest first, the newest kept
    assert writer.dropped == 0 and writer.written == 300


def test_a_full_queue_drops_and_counts_instead_of_blocking(tmp_path: Path) -> None:
    writer = LineWriter(tmp_path / "r.jsonl", queue_size=2)
    release = threading.Event()
    emit = writer._emit
    writer._emit = lambda line: (release.wait(10), emit(line))  # type: ignore[method-assign]
    started = time.monotonic()
    results = [writer.write({"i": i}) for i in range(10)]
    assert time.monotonic() - started < 1.0  # never waited for the disk
    assert results.count(False) == writer.dropped >= 7
    release.set()
    writer.close()
    assert len(read_lines(tmp_path / "r.jsonl")) == 10 - writer.dropped


# -- routing state -------------------------------------------------------------


def _router(tmp_path: Path, routes: dict[str, Any] | None = None) -> tuple[Path, RoutingTable]:
    from trtspec.artifacts.routing import load_routing

    router = tmp_path / "router"
    router.mkdir(parents=True, exist_ok=True)
    routes = routes or {"code": {"variant": "ngram", "canary_percent": 5}}
    path = router / "routing.json"
    path.write_text(json.dumps({"schema_version": 1, "routes": routes}))
    return router, load_routing(path)


def test_a_change_is_atomic_recorded_and_seen_by_the_router(tmp_path: Path) -> None:
    router, table = _router(tmp_path)
    folder = router / "rollout"
    warnings: list[str] = []
    watcher = st.StateWatcher(table, router / "routing.json", folder, warn=warnings.append)
    assert watcher.table().routes["code"].canary_percent == 5.0
    entry = st.change(
        folder,
        router / "routing.json",
        table,
        "code",
        percent=25,
        status=st.RAMPING,
        action="advance",
        by="ana",
        why="window supports it",
    )
    assert entry is not None
    assert (entry["from_percent"], entry["to_percent"], entry["who"]) == (5.0, 25.0, "ana")
    assert watcher.refresh(force=True).routes["code"].canary_percent == 25.0
    assert [e["why"] for e in st.read_history(folder)] == ["window supports it"]
    # only_if sees the state under the lock: a second automatic rollback is a no-op
    for expected in (True, False):
        got = st.change(
            folder,
            router / "routing.json",
            table,
            "code",
            percent=0,
            status=st.ROLLED_BACK,
            action="rollback",
            by="router",
            why="breach",
            only_if=lambda now: now.status != st.ROLLED_BACK,
        )
        assert (got is not None) is expected
    assert len(st.read_history(folder)) == 2
    assert not warnings
    assert not list(folder.glob(".state.json.*"))  # no temp file left behind


def test_a_state_for_another_routing_table_is_refused(tmp_path: Path) -> None:
    router, table = _router(tmp_path)
    folder = router / "rollout"
    folder.mkdir()
    other = st.RolloutState("0" * 64, {"code": st.RouteState(100.0, st.COMPLETE)})
    (folder / st.STATE_FILE).write_text(json.dumps(other.to_dict()))
    warnings: list[str] = []
    watcher = st.StateWatcher(table, router / "routing.json", folder, warn=warnings.append)
    assert watcher.table().routes["code"].canary_percent == 5.0
    assert "written for another routing table" in warnings[0]


# -- the live window -----------------------------------------------------------


def _records(arm: str, n: int, ms_per_token: float, *, errors: int = 0, jitter: float = 0.05):
    rng = np.random.default_rng(len(arm) * 1000 + n)
    out = []
    for i in range(n):
        cost = ms_per_token * float(np.exp(rng.normal(0, jitter)))
        out.append(
            {
                "route": "code",
                "arm": arm,
                "completion_tokens": 32,
                "latency_ms": cost * 32,
                "ttft_ms": cost,
                "tokens_per_second": 1000 / cost,
                "draft_tokens": 40 if arm == "canary" else None,
                "accepted_tokens": 30 if arm == "canary" else None,
                "error": "boom" if i < errors else None,
            }
        )
    return out


@pytest.mark.parametrize(
    ("canary_ms", "errors", "n", "verdict", "reason"),
    [
        (5.0, 0, 30, ADVANCE, "speedup 1.96x [1.91, 2.01]"),
        (10.0, 0, 30, HOLD, "not above 1.05"),
        (20.0, 0, 30, ROLLBACK, "canary p95 latency +"),
        (5.0, 3, 30, ROLLBACK, "canary error rate 10.0% > 1.0%"),
        (5.0, 0, 10, HOLD, "window too small: 10 canary"),
    ],
)
def test_window_verdicts(canary_ms, errors, n, verdict, reason) -> None:
    got = compare(
        "code",
        _records("canary", n, canary_ms, errors=errors),
        _records("control", 60, 10.0),
        THRESHOLDS,
        min_requests=20,
    )
    assert got.verdict == verdict, got.reasons
    assert any(reason in r for r in got.reasons), got.reasons
    if n >= 20 and not errors:
        assert got.canary.acceptance == 0.75 and got.control.acceptance is None


# -- the router's bookkeeping --------------------------------------------------


class _Logger:
    warnings: ClassVar[list[str]] = []

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.warnings.append(message)


class _NoMetricsStub:
    """The part of pb_utils Live touches when a stub has no metrics API."""

    Logger = _Logger


def _final(variant: str) -> dict[str, np.ndarray]:
    ints = {"prompt_tokens": 7, "completion_tokens": 4, "draft_tokens": 6, "accepted_tokens": -1}
    out = {k: np.array([v], dtype=np.int32) for k, v in ints.items()}
    out["variant"] = np.array([variant.encode()], dtype=np.object_)
    out["fallback"] = np.array([False])
    out["output_ids"] = np.array([1, 2], dtype=np.int32)
    return out


def test_the_router_logs_every_field_and_rolls_back_on_an_error_breach(tmp_path: Path) -> None:
    router, table = _router(tmp_path, {"code": {"variant": "ngram", "canary_percent": 50}})
    config = st.RolloutConfig(
        model="m",
        min_requests=5,
        variants={"ngram": {"speculative": True, "draft_model": None, "num_speculative_tokens": 3}},
    )
    live = Live(router, router / "routing.json", table, _NoMetricsStub, config)
    for i in range(40):
        rid = f"r{i}"
        now = live.table()
        choice = choose(now, "code", rid)
        tracked = Tracked()
        live.begin(
            tracked,
            table=now,
            route="code",
            request_id=rid,
            choice=choice,
            inputs={"temperature": np.array([0.0], dtype=np.float32)},
        )
        tracked.track(_final(choice.variant), is_final=True)
        live.end(tracked, "engine failed" if choice.canary else None)
    live.close()
    lines = read_lines(router / "rollout" / st.LOG_FILE)
    assert len(lines) == 40
    assert all(list(r) == [*FIELDS, TIME_FIELD] for r in lines)
    canary = next(r for r in lines if r["arm"] == "canary")
    assert canary["accepted_tokens"] is None  # reported as -1: not known
    assert (canary["draft_tokens"], canary["num_speculative_tokens"]) == (6, 3)
    assert canary["error"] == "engine failed" and canary["latency_ms"] is None
    state = st.read_state(router / "rollout" / st.STATE_FILE)
    assert state is not None and state.routes["code"] == st.RouteState(0.0, st.ROLLED_BACK)
    (entry,) = st.read_history(router / "rollout")
    assert entry["who"] == "router (automatic)" and entry["trigger"] == "window"
    assert "canary error rate" in entry["why"]
    # rolled back: the rest of the requests went to the fallback
    assert all(r["arm"] == "control" for r in lines[-10:])
    assert isinstance(Choice, type)


# -- trtspec rollout -----------------------------------------------------------


def _served_repo(tmp_path: Path, canary_ms: float) -> Path:
    repo = tmp_path / "triton_repo" / "demo"
    router, _ = _router(repo, {"code": {"variant": "ngram", "canary_percent": 5}})
    (repo / "trtspec-repo.json").write_text(json.dumps({"schema_version": 1}))
    (router / st.CONFIG_FILE).write_text(json.dumps(st.RolloutConfig(min_requests=20).to_dict()))
    lines = _records("canary", 30, canary_ms) + _records("control", 60, 10.0)
    (router / "rollout").mkdir()
    (router / "rollout" / st.LOG_FILE).write_text(
        "".join(json.dumps({**r, "request_id": f"x{i}"}) + "\n" for i, r in enumerate(lines))
    )
    return repo


def _run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["rollout", *args])


def test_status_advance_rollback_history(tmp_path: Path) -> None:
    repo = _served_repo(tmp_path, canary_ms=5.0)
    status = _run("status", str(repo))
    assert status.exit_code == 0, status.output
    assert "code: 5% on ngram (ramping); speedup 1.96x [1.91, 2.01] (95%)" in status.stdout
    assert "verdict advance → next 25%" in status.stdout
    data = json.loads(_run("status", str(repo), "--format", "json").stdout)
    assert data["routes"][0]["canary"]["requests"] == 30
    moved = _run("advance", "code", str(repo), "--by", "ana", "--why", "looks good")
    assert moved.exit_code == 0, moved.output
    assert moved.stdout == "code: 5% → 25% (advance, ramping)\n"
    back = _run("rollback", "code", str(repo), "--by", "ana")
    assert back.exit_code == 0 and "25% → 0% (rollback, rolled_back)" in back.stdout
    again = _run("advance", "code", str(repo))
    assert again.exit_code == 3
    assert "Error: route 'code' was rolled back to baseline" in again.output
    history = json.loads(_run("history", str(repo), "--format", "json").stdout)
    assert [(e["action"], e["who"], e["why"]) for e in history] == [
        ("advance", "ana", "looks good"),
        ("rollback", "ana", "rolled back by hand"),
    ]


def test_advance_is_held_unless_forced_and_forcing_is_recorded(tmp_path: Path) -> None:
    repo = _served_repo(tmp_path, canary_ms=10.0)
    held = _run("advance", "code", str(repo))
    assert held.exit_code == 3, held.output
    assert (
        "Error: route 'code' held at 5%: speedup 0.98x [0.96, 1.01] not above 1.05\n" in held.output
    )
    assert "Hint: Wait for more traffic, or pass --force" in held.output
    forced = _run("advance", "code", str(repo), "--force", "--format", "json")
    assert forced.exit_code == 0, forced.output
    entry = json.loads(forced.stdout)
    assert (entry["forced"], entry["verdict"], entry["to_percent"]) == (True, "hold", 25.0)


def test_an_unknown_route_is_a_clear_error(tmp_path: Path) -> None:
    repo = _served_repo(tmp_path, canary_ms=5.0)
    got = _run("rollback", "chat", str(repo))
    assert got.exit_code == 1
    assert "route 'chat' has no variant to roll out (routes with one: code)" in got.output
    assert "Traceback" not in got.output
    bad = _run("status", str(repo), "--since", "soon")
    assert bad.exit_code == 2 and "'soon' is not a duration" in bad.output


def test_the_dashboard_uses_the_router_series_and_triton_gpu_and_queue() -> None:
    import re

    text = (ROOT / "docs" / "grafana" / "trtspec-rollout.json").read_text()
    dashboard = json.loads(text)
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    used = set(re.findall(r"\btrtspec_[a-z_]+", exprs))
    used = {re.sub(r"_(bucket|count|sum)$", "", u) for u in used}
    assert used == set(SERIES), used ^ set(SERIES)
    for triton in ("nv_gpu_memory_used_bytes", "nv_inference_queue_duration_us"):
        assert triton in exprs
    assert "arm" in exprs and "histogram_quantile(0.95" in exprs


def test_the_demo_ends_with_the_first_rollout_step(tmp_path: Path) -> None:
    import shutil

    from trtspec.demo import rollout_plan

    # as a clean clone has it before the demo fetches the model
    shutil.copytree(ROOT / "build_specs", tmp_path / "build_specs")
    model = tmp_path / ".cache" / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    routing = tmp_path / "demo-cpu-1" / "routing.yaml"
    routing.parent.mkdir()
    routing.write_text(
        "schema_version: 1\ndefault_variant: baseline\nroutes:\n"
        "  json_fill: {variant: ngram, num_draft_tokens: 4, canary_percent: 5,"
        " decision: promote, fallback_variant: baseline}\n"
        "  rag_copy_heavy: {variant: baseline, decision: exclude}\n"
    )
    lines = rollout_plan(tmp_path / "build_specs" / "demo-cpu.yaml", routing, tmp_path)
    assert lines[1:4] == [
        "First rollout step:",
        "  json_fill: 5% of its requests on ngram, the rest on baseline; then 25% → 50% → 100%",
        "  rag_copy_heavy: stays on baseline (exclude)",
    ]
    assert lines[-1].startswith("  trtspec rollout status triton_repo/demo-cpu")


def test_serving_does_not_make_the_repository_fingerprint_stale(tmp_path: Path) -> None:
    from trtspec.fingerprint import repository_hash

    router, _ = _router(tmp_path)
    before = repository_hash(tmp_path)
    (router / "rollout").mkdir()
    (router / "rollout" / st.LOG_FILE).write_text('{"route": "code"}\n')
    (router / "rollout" / st.STATE_FILE).write_text("{}")
    assert repository_hash(tmp_path) == before
    (router / st.CONFIG_FILE).write_text("{}")  # the rollout's settings are part of it
    assert repository_hash(tmp_path) != before
