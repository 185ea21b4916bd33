"""`trtspec bench` against a real tritonserver (the nvidia-pytriton binary)
serving echo orchestrators with the docs/design/orchestrator.md contract: a baseline,
a faster lossless variant swept over k, and a lossy variant. Checks the JSONL
rows, the summary recomputed from them, equality at temperature 0, the
decisions, routing.yaml, the HTML report with its images, open-loop load,
--isolate, and that Ctrl-C or kill -9 mid-run keeps every completed request
for `trtspec report`."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from trtspec.bench import stats
from trtspec.bench.echo_model import write_echo_repository
from trtspec.bench.records import read_requests
from trtspec.bench.report_console import console_lines
from trtspec.bench.report_notes import incident_note
from trtspec.bench.runner import BenchOptions, run_benchmark
from trtspec.cli.main import cli
from trtspec.spec import load_spec

pytestmark = pytest.mark.slow

COPY_PROMPTS = [
    "The bridge opened in 1932 and is 503 metres long. ",
    "Tomatoes and basil share bed one this year. ",
    "Flight KL1234 departs at 09:15 from gate D7. ",
    "Sample B7 has a pH of 6.8 at four metres. ",
]
JSON_DOCS = ['{"a": 1, "b": "xy"}', '{"a": 22, "b": "north"}', '{"a": 3, "b": "q"}']
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
MODELS: dict[str, dict[str, object]] = {
    "baseline": {"round_ms": 8},
    "fast": {"round_ms": 8, "max_accept": 3},
    "lossy": {"round_ms": 8, "max_accept": 3, "corrupt": True},
}


def _write_spec(root: Path, *, requests: int = 6, concurrency: str = "[2]") -> Path:
    routes = root / "routes"
    routes.mkdir(parents=True, exist_ok=True)
    with open(routes / "copy.jsonl", "w") as fh:
        for p in COPY_PROMPTS:
            # the echo model repeats the prompt, so its first 16 characters are the answer
            fh.write(json.dumps({"prompt": p, "golden": p[:16]}) + "\n")
    with open(routes / "json.jsonl", "w") as fh:
        for doc in JSON_DOCS:
            fh.write(json.dumps({"prompt": doc, "max_tokens": len(doc), "schema": SCHEMA}) + "\n")
    spec = root / "echo.yaml"
    spec.write_text(f"""\
name: echo
backend: reference
target: {{model: example-org/tiny, family: llama}}
variants:
  - {{name: fast, mode: ngram, max_draft_len: 4, num_draft_tokens: [1, 3]}}
  - {{name: lossy, mode: draft_model, draft: {{model: example-org/tiny, family: llama}},
     max_draft_len: 4, num_draft_tokens: [2]}}
routes:
  copy: {{prompts: routes/copy.jsonl, max_tokens: 16, checks: [golden]}}
  json: {{prompts: routes/json.jsonl, max_tokens: 32, checks: [json_schema]}}
bench:
  concurrency: {concurrency}
  temperatures: [0.0]
  warmup_requests: 1
  requests_per_route: {requests}
""")
    return spec


@pytest.fixture(scope="module")
def echo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = write_echo_repository(tmp_path_factory.mktemp("echo") / "repo", MODELS)
    manifest = {
        "schema_version": 1,
        "spec": "echo",
        "spec_hash": None,
        "backend": "reference",
        "trtllm_version": None,
        "variants": ["baseline", "fast", "lossy"],
        "models": {
            n: {"role": "orchestrator", "calls": [], "variant": n, "mode": None} for n in MODELS
        },
    }
    (repo / "trtspec-repo.json").write_text(json.dumps(manifest))
    return repo


@pytest.fixture(scope="module")
def server(echo_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from trtspec.serve import Server

    log = tmp_path_factory.mktemp("log") / "tritonserver.log"
    with Server(echo_repo, log_path=log) as srv:
        yield srv
    assert "Traceback" not in log.read_text(errors="replace")


def _by(rows: list[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    return [r for r in rows if not r["warmup"] and all(r[k] == v for k, v in match.items())]


def test_bench_cli_end_to_end(server: Any, tmp_path: Path) -> None:
    # One request at a time: each prompt's arms run back to back, so a stall
    # of this shared machine hits a pair together and six pairs decide. (At a
    # level above 1 the arms run in blocks, a pair's rows further apart in
    # time; test_bench_parity and test_bench_external run level 2.)
    spec = _write_spec(tmp_path, concurrency="[1]")
    run = tmp_path / "run"
    res = CliRunner().invoke(
        cli,
        [
            "bench",
            str(spec),
            "--endpoint",
            server.grpc_url,
            "--metrics-url",
            server.metrics_url,
            "--run-dir",
            str(run),
            "--fail-on",
            "speedup<1.0@copy/fast",
            "--fixed-count",
        ],
    )
    assert res.exit_code == 0, res.output
    rows = read_requests(run / "requests.jsonl")
    measured = [r for r in rows if not r["warmup"]]
    # 2 routes x 6 samples x 4 arms (baseline, fast k=1, fast k=3, lossy k=2)
    assert len(measured) == 48
    assert len(rows) - len(measured) == 2 * 1 * 4
    assert all(r["error"] is None for r in rows)
    r0 = _by(rows, route="copy", variant="fast", num_speculative_tokens=3, sample_index=0)[0]
    assert r0["output_text"] == COPY_PROMPTS[0][:16]
    assert (r0["completion_tokens"], r0["prompt_tokens"], r0["rounds"]) == (
        16,
        len(COPY_PROMPTS[0]),
        4,
    )
    assert (r0["draft_tokens"], r0["accepted_tokens"]) == (12, 12)
    # 4 rounds, each drafting 3 tokens, all accepted
    assert r0["drafted_per_position"] == r0["accepted_per_position"] == {"1": 4, "2": 4, "3": 4}
    assert r0["speculative"] is True and r0["mode"] == "ngram"
    assert r0["served_variant"] == "fast" and r0["fallback"] is False
    assert r0["ttft_ms"] < r0["latency_ms"]
    assert r0["tpot_ms"] == pytest.approx((r0["latency_ms"] - r0["ttft_ms"]) / 15)
    assert r0["quality"] == {
        "golden": {"status": "pass", "detail": "similarity 1.00 (threshold 0.60)"}
    }
    # paired: every sample went to every arm with the same seed, in ABBA order
    for s in range(6):
        seen = _by(rows, route="json", sample_index=s)
        assert {(r["variant"], r["num_speculative_tokens"]) for r in seen} == {
            ("baseline", None),
            ("fast", 1),
            ("fast", 3),
            ("lossy", 2),
        }
        assert len({r["seed"] for r in seen}) == 1
    # ABBA per prompt at level 1
    sent = sorted(_by(rows, route="json"), key=lambda r: r["send_time_unix"])
    forward = [("baseline", None), ("fast", 1), ("fast", 3), ("lossy", 2)]
    assert [(r["variant"], r["num_speculative_tokens"]) for r in sent] == 3 * (
        forward + forward[::-1]
    )

    summary = json.loads((run / "summary.json").read_text())
    assert summary["schema_version"] == 1 and summary["complete"] is True
    assert summary["spec"]["name"] == "echo" and summary["spec"]["hash"]
    assert summary["versions"]["tritonserver"] == "2.51.0"
    cells = {(c["route"], c["variant"], c["num_speculative_tokens"]): c for c in summary["cells"]}
    for (route, variant, k), cell in cells.items():
        mine = _by(rows, route=route, variant=variant, num_speculative_tokens=k)
        assert cell["count"] == len(mine) == 6
        assert cell["ttft_ms"]["p50"] == pytest.approx(
            stats.percentile([r["ttft_ms"] for r in mine], 50)
        )
        assert cell["latency_ms"]["p95"] == pytest.approx(
            stats.percentile([r["latency_ms"] for r in mine], 95)
        )
        if variant != "baseline":
            base = {r["sample_index"]: r for r in _by(rows, route=route, variant="baseline")}
            ratios = [
                (
                    base[r["sample_index"]]["latency_ms"]
                    / base[r["sample_index"]]["completion_tokens"]
                )
                / (r["latency_ms"] / r["completion_tokens"])
                for r in mine
            ]
            # the geometric mean of the paired ratios, computed here independently
            geo_mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
            assert cell["speedup"]["point"] == pytest.approx(geo_mean)
            drafted = sum(r["draft_tokens"] for r in mine)
            assert cell["acceptance_rate"] == pytest.approx(
                sum(r["accepted_tokens"] for r in mine) / drafted
            )
    assert cells[("copy", "fast", 3)]["equal_rate"] == 1.0
    assert cells[("json", "fast", 1)]["equal_rate"] == 1.0
    assert cells[("json", "lossy", 2)]["equal_rate"] == 0.0
    assert cells[("json", "lossy", 2)]["quality_pass_rate"] == 0.0
    assert cells[("json", "baseline", None)]["quality_pass_rate"] == 1.0
    assert cells[("copy", "fast", 3)]["speedup"]["ci_low"] > 1.5
    assert cells[("copy", "baseline", None)]["server_memory_bytes"] > 0

    decisions = {
        (d["route"], d["variant"], d["num_speculative_tokens"]): d for d in summary["decisions"]
    }
    assert decisions[("copy", "fast", 3)]["decision"] == "promote"
    assert decisions[("copy", "fast", 3)]["best_k"] is True
    assert decisions[("json", "lossy", 2)]["decision"] == "exclude"
    routing = yaml.safe_load((run / "routing.yaml").read_text())
    evidence = routing["routes"]["copy"].pop("evidence")
    assert routing["routes"]["copy"] == {
        "variant": "fast",
        "num_draft_tokens": 3,
        "canary_percent": 5,  # a promoted route starts as a canary (rollout default)
        "decision": "promote",
        "fallback_variant": "baseline",
    }
    # the same paired estimate as the summary's headline
    assert evidence["speedup"] == round(cells[("copy", "fast", 3)]["speedup"]["point"], 4)
    assert evidence["pairs"] == 6
    assert res.stdout.splitlines() == console_lines(summary)
    assert any(
        line.startswith("route=copy  baseline ")
        and "fast(k=3)" in line
        and line.endswith("quality pass  → promote  (short outputs)")
        for line in res.stdout.splitlines()
    )
    assert "bench: route=copy concurrency=1 T=0 24 requests over 4 arm(s)" in res.stderr
    html = (run / "report.html").read_text()
    for png in (
        "speedup.png",
        "latency_copy.png",
        "latency_json.png",
        "acceptance_by_position_copy.png",
    ):
        assert (run / "plots" / png).read_bytes()[:4] == b"\x89PNG"
        assert f"src='plots/{png}'" in html


def test_bench_open_loop_and_gate_exit(server: Any, tmp_path: Path) -> None:
    """Through the CLI: --request-rate adds open-loop cells, --temperatures,
    --prefix-cache warm and --format json (the summary on stdout)."""
    spec = _write_spec(tmp_path, requests=4, concurrency="[1]")
    res = CliRunner().invoke(
        cli,
        [
            "bench",
            str(spec),
            "--endpoint",
            server.grpc_url,
            "--run-dir",
            str(tmp_path / "run"),
            "--routes",
            "copy",
            "--variants",
            "fast",
            "--num-draft-tokens",
            "2",
            "--request-rate",
            "40",
            "--temperatures",
            "0,0.8",
            "--prefix-cache",
            "warm",
            "--fixed-count",
            "--no-plots",
            "--format",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert printed["prefix_cache"]["policy"] == "warm"
    assert printed["prefix_cache"]["enforced"] is True
    assert printed["settings"]["prefix_cache"] == "warm"
    result = SimpleNamespace(summary=printed)
    loads = {(c["load"], c["temperature"]) for c in result.summary["cells"]}
    assert loads == {
        ("concurrency=1", 0.0),
        ("rate=40/s", 0.0),
        ("concurrency=1", 0.8),
        ("rate=40/s", 0.8),
    }
    rows = read_requests(tmp_path / "run" / "requests.jsonl")
    open_rows = _by(rows, load="rate=40/s")
    assert len(open_rows) == 2 * 4 * 2 and all(r["send_lag_ms"] is not None for r in open_rows)
    hot = [c for c in result.summary["cells"] if c["temperature"] == 0.8]
    assert all(c["equal_rate"] is None for c in hot)
    res = CliRunner().invoke(
        cli, ["report", str(tmp_path / "run"), "--no-plots", "--fail-on", "speedup<100@copy"]
    )
    assert res.exit_code == 3
    assert res.stderr.count("speedup<100@copy: speedup=") == 4


def test_bench_isolate_serves_one_variant_at_a_time(echo_repo: Path, tmp_path: Path) -> None:
    """Through the CLI: --repo names the repository to serve, --isolate
    serves each variant in its own tritonserver."""
    spec = _write_spec(tmp_path, requests=2, concurrency="[1]")
    res = CliRunner().invoke(
        cli,
        [
            "bench",
            str(spec),
            "--repo",
            str(echo_repo),
            "--isolate",
            "--run-dir",
            str(tmp_path / "run"),
            "--routes",
            "copy",
            "--variants",
            "fast",
            "--num-draft-tokens",
            "3",
            "--warmup",
            "0",
            "--fixed-count",
            "--no-plots",
            "--format",
            "json",
        ],
    )
    assert res.exit_code == 0, res.output
    result = SimpleNamespace(summary=json.loads(res.stdout))
    assert result.summary["server"]["repo"] == str(echo_repo)
    logs = sorted(p.name for p in (tmp_path / "run").glob("tritonserver-*.log"))
    assert logs == ["tritonserver-baseline.log", "tritonserver-fast.log"]
    # each server loaded only its own variant
    fast_log = (tmp_path / "run" / "tritonserver-fast.log").read_text()
    assert "successfully loaded 'fast'" in fast_log
    assert "successfully loaded 'baseline'" not in fast_log
    cell = next(c for c in result.summary["cells"] if c["variant"] == "fast")
    assert cell["count"] == 2 and cell["equal_rate"] == 1.0
    assert result.summary["server"]["isolate"] is True


def test_bench_starts_its_own_server(echo_repo: Path, tmp_path: Path) -> None:
    # 5 pairs: the fewest a decision takes (bench.decision.min_pairs)
    spec = load_spec(_write_spec(tmp_path, requests=5, concurrency="[1]"))
    result = run_benchmark(
        spec,
        BenchOptions(
            output_dir=tmp_path / "run",
            repo=echo_repo,
            routes=["json"],
            variants=["lossy"],
            warmup_requests=0,
            plots=False,
        ),
    )
    assert (tmp_path / "run" / "tritonserver.log").is_file()
    cells = {c["variant"]: c for c in result.summary["cells"]}
    # CPU: memory is the RSS of the server process and its Python backend stubs
    assert cells["baseline"]["server_memory_kind"] == "process_rss"
    assert cells["baseline"]["server_memory_bytes"] > 10 * 2**20
    assert [d["decision"] for d in result.summary["decisions"]] == ["exclude"]
    assert result.summary["routing"]["routes"]["json"] == {
        "variant": "baseline",
        "decision": "exclude",
    }


# Per arm (4 arms on `copy`): the signal lands after 20 rows.
INTERRUPTED_REQUESTS = 60


def _start_bench(spec: Path, run: Path, url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "toolkit")}
    # Started with SIGINT ignored, as a shell without job control starts a
    # background job (`trtspec bench … &` in a script): `kill -INT` must still
    # stop the bench, so it installs its own handler. (exec keeps an ignored
    # signal ignored; the previous disposition is restored here at once.)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return _popen_bench(spec, run, url, env)
    finally:
        signal.signal(signal.SIGINT, previous)


def _popen_bench(spec: Path, run: Path, url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtspec.cli.main",
            "bench",
            str(spec),
            "--endpoint",
            url,
            "--run-dir",
            str(run),
            "--routes",
            "copy",
            "--requests",
            str(INTERRUPTED_REQUESTS),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )


def _wait_rows(path: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if path.is_file() and len(path.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        time.sleep(0.05)
    raise AssertionError("bench produced no rows in time")


@pytest.mark.parametrize("how", ["sigkill", "sigint"])
def test_interrupted_bench_keeps_completed_requests(server: Any, tmp_path: Path, how: str) -> None:
    spec = _write_spec(tmp_path)
    run = tmp_path / "run"
    proc = _start_bench(spec, run, server.grpc_url)
    try:
        _wait_rows(run / "requests.jsonl", 20, proc)
        proc.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()  # reaps it and closes its pipes
    lines = (run / "requests.jsonl").read_text().splitlines()
    assert 20 <= len(lines) < INTERRUPTED_REQUESTS * 4  # stopped before the end
    rows = read_requests(run / "requests.jsonl")
    assert len(rows) >= len(lines) - 1  # at most a torn last line after kill -9
    assert all(r["error"] is None for r in rows)
    if how == "sigint":
        assert proc.returncode == 130
        assert b"Interrupted." in err
        assert json.loads((run / "run.json").read_text())["complete"] is False
        assert (run / "report.html").is_file()  # rendered on the way out
    else:
        assert proc.returncode == -signal.SIGKILL
    res = CliRunner().invoke(cli, ["report", str(run), "--no-plots"])
    assert res.exit_code == 0, res.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is False
    assert summary["totals"]["requests"] + summary["totals"]["warmup_requests"] == len(rows)
    assert (run / "report.html").is_file()


def _kill_after_rows(rows_file: Path, rows: int, pick: Any, killed: list[int]) -> None:
    """Once ``rows`` rows are written, SIGKILL the first pid ``pick()`` returns."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if rows_file.is_file() and len(rows_file.read_text().splitlines()) >= rows:
            break
        time.sleep(0.05)
    pid = pick()
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)


def _run_with_a_kill(echo_repo: Path, tmp_path: Path, pick: Any) -> tuple[Any, list[int]]:
    spec = load_spec(_write_spec(tmp_path, requests=6, concurrency="[1]"))
    run_dir = tmp_path / "run"
    killed: list[int] = []
    killer = threading.Thread(
        target=_kill_after_rows, args=(run_dir / "requests.jsonl", 4, pick, killed), daemon=True
    )
    killer.start()
    result = run_benchmark(
        spec,
        BenchOptions(
            output_dir=run_dir,
            repo=echo_repo,
            routes=["copy"],
            variants=["fast"],
            num_draft_tokens=[3],
            warmup_requests=0,
            request_timeout_s=60,
            plots=False,
        ),
    )
    killer.join(timeout=5)
    assert killed, "the test found nothing to kill"
    return result, killed


def _check_recovered_run(result: Any, what: str) -> list[dict[str, Any]]:
    """Every sample answered once; every request the incident failed is an
    error row marked ``incident`` (counted), then sent again; no exclude."""
    run_dir = result.run_dir
    rows = read_requests(run_dir / "requests.jsonl")
    failed = [r for r in rows if r["error"]]
    answered = [r for r in rows if not r["error"]]
    assert len(answered) == 12, rows
    assert failed and all(r["incident"] and what in r["error"] for r in failed), [
        (r["seq"], r["incident"], r["error"]) for r in failed
    ]
    totals = result.summary["totals"]
    assert totals["errors"] == totals["incidents"] == len(failed)
    assert result.summary["complete"] is True
    incidents = result.summary["incidents"]
    assert len(incidents) == 1, incidents
    assert what in incidents[0]["error"]
    assert incidents[0]["action"] == "tritonserver restarted on the same ports"
    assert incidents[0]["requests_failed"] == len(failed)
    assert "decision: exclude" not in (run_dir / "routing.yaml").read_text()
    log = (run_dir / "tritonserver.log").read_text(errors="replace")
    assert log.count("Started GRPCInferenceService") == 2  # one log, two starts
    # the incident is named after the model and route of a request it failed
    assert incidents[0]["model"] in {r["model"] for r in failed}, (incidents, failed)
    assert incidents[0]["route"] in {r["route"] for r in failed}, (incidents, failed)
    note = incident_note(incidents[0])
    assert note.startswith(f"server incident: {incidents[0]['model']} ({incidents[0]['route']}): ")
    assert "None" not in note, note
    assert note in (run_dir / "report.md").read_text()
    return failed


def test_bench_restarts_its_server_when_a_stub_dies(echo_repo: Path, tmp_path: Path) -> None:
    """A Python-backend stub killed mid-run is noticed by the watchdog; the
    server the bench started comes back on the same ports, the requests it
    failed are errors (and sent again), and the run says so."""
    from trtspec.serve import group_members

    # this module's shared server serves the same repository: not ours to kill
    other_servers = set(_server_pids(echo_repo))

    def baseline_stub() -> int | None:
        for pid in set(_server_pids(echo_repo)) - other_servers:
            for member in group_members(pid):
                cmd = Path(f"/proc/{member}/cmdline").read_bytes().replace(b"\0", b" ")
                if b"triton_python_backend_stub" in cmd and b"/baseline/" in cmd:
                    return member
        return None

    result, killed = _run_with_a_kill(echo_repo, tmp_path, baseline_stub)
    _check_recovered_run(result, f"model 'baseline' (pid {killed[0]}) was killed by SIGKILL")
    assert result.summary["incidents"][0]["model"] == "baseline"


def test_bench_restarts_a_dead_server_it_owns(echo_repo: Path, tmp_path: Path) -> None:
    """tritonserver itself killed under a bench that started it: restarted on
    the same ports, the run completes, nothing is excluded for it."""
    other_servers = set(_server_pids(echo_repo))

    def our_server() -> int | None:
        return next(iter(set(_server_pids(echo_repo)) - other_servers), None)

    result, killed = _run_with_a_kill(echo_repo, tmp_path, our_server)
    _check_recovered_run(result, f"tritonserver (pid {killed[0]}) was killed by SIGKILL")


def test_bench_on_an_endpoint_that_dies_stops_incomplete(echo_repo: Path, tmp_path: Path) -> None:
    """With --endpoint the server is not the bench's to restart: it stops,
    keeps what completed, marks the run incomplete and exits 1; nothing is
    written as ``exclude`` because of it."""
    from trtspec.serve import Server

    spec = _write_spec(tmp_path, requests=6, concurrency="[1]")
    run = tmp_path / "run"
    killed: list[int] = []
    with Server(echo_repo, log_path=tmp_path / "endpoint.log") as server:
        killer = threading.Thread(
            target=_kill_after_rows,
            args=(run / "requests.jsonl", 4, lambda: server.pid, killed),
            daemon=True,
        )
        killer.start()
        res = CliRunner().invoke(
            cli,
            [
                "bench",
                str(spec),
                "--endpoint",
                server.grpc_url,
                "--run-dir",
                str(run),
                "--routes",
                "copy",
                "--variants",
                "fast",
                "--num-draft-tokens",
                "3",
                "--warmup",
                "0",
                "--no-plots",
                "--timeout",
                "60",
            ],
        )
        killer.join(timeout=5)
    assert killed
    assert res.exit_code == 1, res.output
    assert (
        f"Error: the benchmark is incomplete: the server at {server.grpc_url} stopped "
        "answering (" in res.stderr
    )
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith(f"the server at {server.grpc_url} stopped")
    rows = read_requests(run / "requests.jsonl")
    assert 4 <= len(rows) < 12
    assert [r["incident"] for r in rows if r["error"]] == ["server_unreachable"]
    assert "decision: exclude" not in (run / "routing.yaml").read_text()


def _server_pids(repo: Path) -> list[int]:
    """tritonservers serving ``repo`` (the machine may run other people's)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if b"tritonserver" in cmd and f"--model-repository={repo} ".encode() in cmd:
            pids.append(int(proc.name))
    return pids


def test_bench_until_decided_stops_a_clear_win_early(server: Any, tmp_path: Path) -> None:
    """The CLI's default: pairs in batches until the interval decides. The
    echo ``fast`` variant at k=3 is several times faster than the baseline,
    so it stops at a look well before the cap; stderr is not a terminal here,
    so no progress bar is drawn."""
    spec = _write_spec(tmp_path, requests=6, concurrency="[1]")
    run = tmp_path / "run"
    res = CliRunner().invoke(
        cli,
        [
            "bench",
            str(spec),
            "--endpoint",
            server.grpc_url,
            "--run-dir",
            str(run),
            "--routes",
            "copy",
            "--variants",
            "fast",
            "--num-draft-tokens",
            "3",
            "--max-requests",
            "20",
            "--warmup",
            "0",
            "--no-plots",
        ],
    )
    assert res.exit_code == 0, res.output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["settings"]["until_decided"] is True
    assert summary["settings"]["sequential"]["looks"] == 4  # at 5, 10, 15, 20 pairs
    fast = next(c for c in summary["cells"] if c["variant"] == "fast")
    assert fast["stop"] == "faster", fast
    assert fast["pairs_sent"] in (5, 10), fast
    assert fast["speedup"]["confidence"] == pytest.approx(1 - 0.05 / 4)
    rows = [r for r in read_requests(run / "requests.jsonl") if not r["warmup"]]
    assert len(rows) == 2 * fast["pairs_sent"]
    assert "up to 20 pairs per arm over 2 arm(s), until decided" in res.stderr
    assert "pair/s" not in res.stderr and "decided 1/1" not in res.stderr
    assert f"{fast['pairs']} pairs" in res.stdout
