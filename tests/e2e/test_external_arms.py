"""Triton arms and external OpenAI-compatible arms in one benchmark run.

Two real ``openai_reference`` servers (a target-only baseline and a
prompt-lookup ``ngram`` arm, on the tiny model's draft_tokens_external engine;
the session's ``openai_pair``, see tests/conftest.py) stand in for a vLLM
pair; the spec also has trtspec's own baseline and ngram variant.
``build → repo → bench`` (bench starts its own tritonserver) must give rows
for all four arms, acceptance from the servers' metrics for the
external ngram arm and from the orchestrator's responses for the Triton one,
a decision for each speculative arm against its own baseline, one report
holding both kinds of arms, and a routing table with Triton variants only."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fixtures.every_mode import in_process_builds
from tests.fixtures.shared import Shared
from trtspec.bench.records import read_requests
from trtspec.cli.main import cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = [
    "Passage: The bridge opened in 1932 and is 503 metres long. The bridge opened in 1932.\n"
    "Question: When did the bridge open? Quote the passage.",
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib",
]


def _run(*args: str) -> tuple[str, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, (
        f"trtspec {' '.join(args)} exited {result.exit_code}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result.stdout, result.stderr


@pytest.fixture(scope="module")
def workdir(
    tiny_llama: Path, openai_pair: Shared, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("e2e-external")
    (root / "routes").mkdir()
    (root / "routes" / "rag.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    )
    servers = openai_pair.get()
    base, ngram = servers["base"], servers["ngram"]
    (root / "tiny.yaml").write_text(f"""\
name: tiny-ext
backend: reference
target:
  model: {tiny_llama}
  family: llama
  max_batch_size: 2
  max_input_len: 256
  max_seq_len: 512
  max_num_tokens: 1024
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4, num_draft_tokens: [4]}}
routes:
  rag: {{prompts: routes/rag.jsonl, max_tokens: 24}}
bench:
  concurrency: [1]
  warmup_requests: 1
  requests_per_route: 3
  external:
    vllm_base: {{openai: "{base}", model: target}}
    vllm_ngram: {{openai: "{ngram}", model: target, baseline: vllm_base}}
""")
    old = Path.cwd()
    os.chdir(root)
    try:
        yield root
    finally:
        os.chdir(old)


def test_triton_and_external_arms_in_one_report(workdir: Path) -> None:
    # the reference steps run in process (same argv; the subprocess path is
    # tests/e2e/test_pipeline.py's): this test is about the bench's arms
    with in_process_builds():
        _run("build", "tiny.yaml")
    _run("repo", "tiny.yaml")
    out, _ = _run("bench", "tiny.yaml", "--run-dir", "results/run", "--no-plots")
    run = Path("results/run")
    rows = [r for r in read_requests(run / "requests.jsonl") if not r["warmup"]]
    assert not [r["error"] for r in rows if r["error"]]
    assert {(r["variant"], r["arm_kind"], r["pairs_with"]) for r in rows} == {
        ("baseline", "triton", None),
        ("ngram", "triton", "baseline"),
        ("vllm_base", "openai", None),
        ("vllm_ngram", "openai", "vllm_base"),
    }
    assert len(rows) == 4 * 3
    by_arm = {v: [r for r in rows if r["variant"] == v] for v in ("ngram", "vllm_ngram")}
    assert {r["acceptance_source"] for r in by_arm["ngram"]} == {"response"}
    assert {r["acceptance_source"] for r in by_arm["vllm_ngram"]} == {"metrics"}
    # the same prompt-lookup proposer and engine on both sides: the same counts
    assert [r["draft_tokens"] for r in by_arm["vllm_ngram"]] == [
        r["draft_tokens"] for r in by_arm["ngram"]
    ]
    assert [r["accepted_tokens"] for r in by_arm["vllm_ngram"]] == [
        r["accepted_tokens"] for r in by_arm["ngram"]
    ]
    # same prompt text, same greedy tokens: the external arms' text equals Triton's
    texts = {
        v: [
            r["output_text"]
            for r in sorted(rows, key=lambda r: r["sample_index"])
            if r["variant"] == v
        ]
        for v in ("baseline", "vllm_base", "vllm_ngram")
    }
    assert texts["baseline"] == texts["vllm_base"] == texts["vllm_ngram"]

    summary = json.loads((run / "summary.json").read_text())
    decisions = {d["variant"]: d for d in summary["decisions"]}
    assert set(decisions) == {"ngram", "vllm_ngram"}
    assert decisions["ngram"]["baseline"] == "baseline"
    assert decisions["vllm_ngram"]["baseline"] == "vllm_base"
    assert decisions["vllm_ngram"]["arm_kind"] == "openai"
    cells = {c["variant"]: c for c in summary["cells"]}
    assert cells["vllm_ngram"]["acceptance_rate"] is not None
    assert cells["vllm_ngram"]["equal_rate"] == 1.0 and cells["ngram"]["equal_rate"] == 1.0
    assert [c["variant"] for c in summary["cells"]] == [
        "baseline",
        "ngram",
        "vllm_base",
        "vllm_ngram",
    ]
    assert summary["routing"]["routes"]["rag"]["variant"] in ("baseline", "ngram")
    lines = out.splitlines()
    assert any(
        line.startswith("route=rag  baseline ") and " ngram(k=4) " in line for line in lines
    ), out
    assert any(
        line.startswith("route=rag  vllm_base ") and " vllm_ngram " in line for line in lines
    ), out
    report = (run / "report.md").read_text()
    for arm in (
        "| rag | baseline |",
        "| rag | ngram(k=4) |",
        "| rag | vllm_base |",
        "| rag | vllm_ngram |",
    ):
        assert arm in report
    assert "external arm vllm_ngram:" in report
    assert "vllm_ngram" in (run / "report.html").read_text()
