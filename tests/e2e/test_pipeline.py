"""The whole pipeline, as a user runs it, on a tiny real model.

Every stage's CLI command in order, in a temporary working folder:
``validate → build (+ a second, cached build) → inspect → repo → repo --check
→ serve (a real ``trtspec serve`` process) → bench --endpoint → report``,
then the artefacts are checked against each other: JSONL rows vs the
summary, equality with the baseline at temperature 0, the decisions, the
routing file fed back into ``trtspec repo --routing``, and the HTML report's
images. A broken stage (say, a wrong tensor name in the repository) breaks
a later stage's assertion here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.fixtures.serve_cli import wait_ready
from trtspec.bench import stats
from trtspec.bench.decide import judge_cell
from trtspec.bench.records import read_requests
from trtspec.cli.main import cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CODE_PROMPTS = [
    "def add(a, b):\n    ",
    "import os\n\ndef list_files(path):\n    ",
    "class Point:\n    def __init__(self, x, y):\n        ",
]
RAG_PROMPTS = [
    "Passage: The bridge opened in 1932 and is 503 metres long. The bridge opened in 1932.\n"
    "Question: When did the bridge open? Quote the passage.",
    "Passage: Sample B7 has a pH of 6.8 at four metres. Sample B7 has a pH of 6.8.\n"
    "Question: What is the pH of sample B7? Quote the passage.",
    "Passage: Flight KL1234 departs at 09:15 from gate D7. Flight KL1234 departs at 09:15.\n"
    "Question: When does flight KL1234 depart? Quote the passage.",
]
VARIANTS = ("baseline", "ngram", "draft", "lookahead")


def _run(*args: str, expect: int = 0) -> tuple[str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == expect, (
        f"trtspec {' '.join(args)} exited {result.exit_code}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result.stdout, result.stderr


@pytest.fixture(scope="module")
def workdir(tiny_llama: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("e2e")
    routes = root / "specs" / "routes"
    routes.mkdir(parents=True)
    with open(routes / "code_completion.jsonl", "w") as fh:
        for p in CODE_PROMPTS:
            fh.write(json.dumps({"prompt": p}) + "\n")
    with open(routes / "rag_copy_heavy.jsonl", "w") as fh:
        for p in RAG_PROMPTS:
            fh.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": p}], "golden": p.split("\n")[0][9:60]}
                )
                + "\n"
            )
    (root / "specs" / "tiny.yaml").write_text(f"""\
name: tiny-e2e
backend: reference
target:
  model: {tiny_llama}
  family: llama
  max_batch_size: 2
  max_input_len: 256
  max_seq_len: 512
  max_num_tokens: 1024
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 3,
     num_draft_tokens: [4]}}
  - {{name: draft, mode: draft_model, draft: {{model: {tiny_draft}, family: llama}},
     max_draft_len: 3, num_draft_tokens: [3]}}
  - {{name: lookahead, mode: lookahead, window_size: 3, ngram_size: 3,
     verification_set_size: 2}}
routes:
  code_completion: {{prompts: routes/code_completion.jsonl, max_tokens: 24,
                    checks: [python_compile]}}
  rag_copy_heavy: {{prompts: routes/rag_copy_heavy.jsonl, max_tokens: 24, checks: [golden]}}
bench:
  concurrency: [1]
  temperatures: [0.0]
  warmup_requests: 1
  requests_per_route: 3
rollout: {{canary_percent: 100, fallback_variant: baseline}}
""")
    return root


@pytest.fixture(scope="module")
def in_workdir(workdir: Path):
    old = Path.cwd()
    os.chdir(workdir)
    try:
        yield workdir
    finally:
        os.chdir(old)


def test_every_stage_in_order(in_workdir: Path) -> None:
    spec = "specs/tiny.yaml"

    # validate
    out, _ = _run("validate", spec, "--format", "json")
    validated = json.loads(out)
    assert validated["spec"] == "tiny-e2e" and validated["valid"] is True

    # build, then a second build of the unchanged spec runs no step
    _run("build", spec)
    engines = Path("engines/tiny-e2e")
    names = sorted(p.name for p in engines.iterdir() if not p.name.startswith("."))
    assert "target" in names and "target_dte" in names
    assert any(n.startswith("target_lookahead") for n in names)
    assert any(n.startswith("draft_") for n in names)
    out, _ = _run("build", spec, "--format", "json")
    second = json.loads(out)
    statuses = {s["id"]: s["status"] for s in second["steps"]}
    assert statuses and set(statuses.values()) == {"cached"}, f"an unchanged spec rebuilt: {second}"
    assert {e["state"] for e in second["engines"]} == {"cached"}, second["engines"]

    # inspect reads the reference engines like TRT-LLM ones
    out, _ = _run("inspect", str(engines / "target_dte"), "--format", "json")
    info = json.loads(out)
    flat = json.dumps(info)
    assert "draft_tokens_external" in flat.lower() or '"speculative_decoding_mode": 2' in flat

    # repo + check
    _run("repo", spec)
    repo = Path("triton_repo/tiny-e2e")
    assert (repo / "trtspec-repo.json").is_file()
    for model in ("preprocessing", "postprocessing", "router", *VARIANTS):
        assert (repo / model / "config.pbtxt").is_file(), model
    _run("repo", "--check", str(repo))

    # serve in a real process; bench against it; stop with SIGINT
    log = in_workdir / "serve.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtspec.cli.main",
            "serve",
            str(repo),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
            "--format",
            "json",
            "--log-file",
            str(log),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        endpoints = wait_ready(proc, 240)
        grpc = endpoints.get("grpc") or endpoints.get("grpc_url")
        assert grpc and grpc.startswith("127.0.0.1:"), endpoints
        out, _ = _run(
            "bench",
            spec,
            "--endpoint",
            grpc,
            "--run-dir",
            "results/run1",
            "--no-plots",
            "--format",
            "table",
            "--fixed-count",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
    assert proc.returncode in (0, 130), f"trtspec serve exited {proc.returncode} on SIGINT"
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]

    run = Path("results/run1")
    rows = read_requests(run / "requests.jsonl")
    measured = [r for r in rows if not r["warmup"]]
    assert {r["variant"] for r in measured} == set(VARIANTS)
    assert {r["route"] for r in measured} == {"code_completion", "rag_copy_heavy"}
    assert len(measured) == 2 * len(VARIANTS) * 3
    assert all(r["error"] is None for r in measured), [r["error"] for r in measured]
    for r in measured:
        assert r["completion_tokens"] > 0
        assert r["ttft_ms"] <= r["latency_ms"]
        if r["variant"] != "baseline":
            assert 0 <= r["accepted_tokens"] <= r["draft_tokens"]

    summary = json.loads((run / "summary.json").read_text())
    assert summary["totals"]["requests"] == len(measured)
    for cell in summary["cells"]:
        cell_rows = [
            r for r in measured if r["route"] == cell["route"] and r["variant"] == cell["variant"]
        ]
        assert cell["count"] == len(cell_rows)
        assert cell["latency_ms"]["p50"] == pytest.approx(
            stats.percentile([r["latency_ms"] for r in cell_rows], 50)
        )
        if cell["variant"] != "baseline":
            assert cell["draft_tokens"] == sum(r["draft_tokens"] for r in cell_rows)
            assert cell["accepted_tokens"] == sum(r["accepted_tokens"] for r in cell_rows)
            # lossless at temperature 0: token for token the baseline's output
            assert cell["equal_rate"] == 1.0, cell
    # every speculative variant drafted, and the draft-loop ones had drafts accepted
    for variant in VARIANTS[1:]:
        cells = [c for c in summary["cells"] if c["variant"] == variant]
        assert sum(c["draft_tokens"] for c in cells) > 0, f"{variant} never drafted: {cells}"
    for variant in ("ngram", "draft"):
        cells = [c for c in summary["cells"] if c["variant"] == variant]
        assert sum(c["accepted_tokens"] for c in cells) > 0, f"{variant} accepted none: {cells}"
    decided = {(d["route"], d["variant"]): d for d in summary["decisions"]}
    assert sorted(decided) == sorted(
        (route, variant)
        for route in ("code_completion", "rag_copy_heavy")
        for variant in VARIANTS[1:]
    )
    # The verdict is the one the cell's own numbers give (one cell per arm
    # here: concurrency 1, T=0), reasons included; and, independently of the
    # rule's code: lossless, error-free output is never excluded unless
    # slower, and a promote has its whole speedup CI above min_speedup.
    d = summary["settings"]["decision"]
    for (route, variant), dec in decided.items():
        cell = next(c for c in summary["cells"] if (c["route"], c["variant"]) == (route, variant))
        want, reasons = judge_cell(cell, d)
        assert (dec["decision"], dec["reasons"]) == (want, reasons), (dec, cell)
        sp = cell["speedup"]
        if dec["decision"] == "exclude":
            assert sp["ci_high"] < 1.0, (dec, cell)
        if dec["decision"] == "promote":
            assert sp["ci_low"] > d["min_speedup"] and cell["pairs"] >= d["min_pairs"], dec

    # the console table printed the headline numbers of summary.json
    for dec in summary["decisions"]:
        if not dec["best_k"]:
            continue
        h = dec["headline"]
        base, sp = h["baseline_tokens_per_second"], h["speedup"]
        assert re.search(
            rf"route={dec['route']}\s+baseline {base:.0f} tok/s\s+{re.escape(dec['variant'])}"
            rf"\S*\s+speedup {sp['point']:.2f}x .*→ {dec['decision']}",
            out,
        ), out

    # routing.yaml feeds the router
    routing = yaml.safe_load((run / "routing.yaml").read_text())
    assert set(routing["routes"]) == {"code_completion", "rag_copy_heavy"}
    _run("repo", spec, "--routing", str(run / "routing.yaml"))
    _run("repo", "--check", str(repo))

    # report re-renders from the saved rows, now with plots
    _run("report", str(run))
    html = (run / "report.html").read_text()
    images = re.findall(r"<img[^>]+src=['\"]([^'\"]+)['\"]", html)
    assert images, "report.html has no images"
    for src in images:
        if not src.startswith("data:"):
            assert (run / src).is_file(), src
    assert (run / "report.md").is_file()
