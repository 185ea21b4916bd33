"""GPU smoke test: build → repo → serve → one request per arm, with the real
TensorRT-LLM tools and the C++ ``tensorrtllm`` backend, where a GPU and
TensorRT-LLM are present (the Triton TRT-LLM container). Elsewhere it skips
with a reason tests/fixtures/ci_skips.py expects ("no GPU", "no
TensorRT-LLM"). The model is the suite's tiny random Llama, so nothing is
downloaded; the examples folder is ``$TRTLLM_EXAMPLES_DIR`` or the
container's ``/app/examples``."""

from __future__ import annotations

import json
import os
import shutil
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.bench.records import read_requests
from trtspec.cli.main import cli


def _trtllm_version() -> str | None:
    try:
        return version("tensorrt_llm")
    except PackageNotFoundError:
        return None


# Marks, not fixture-time skips: decided at collection, before the session's
# tiny model is built for nothing.
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no GPU: nvidia-smi not found"),
    pytest.mark.skipif(
        _trtllm_version() is None or shutil.which("trtllm-build") is None,
        reason="no TensorRT-LLM: the tensorrt_llm package or trtllm-build is missing",
    ),
]


@pytest.fixture(scope="module")
def gpu_stack() -> tuple[str, str]:
    found = _trtllm_version()
    assert found is not None
    examples = os.environ.get("TRTLLM_EXAMPLES_DIR", "/app/examples")
    assert Path(examples).is_dir(), f"TensorRT-LLM examples not found at {examples}"
    return found.split("+")[0], examples


def _run(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, f"trtspec {' '.join(args)}\n{res.output}"
    return res.stdout


def test_build_repo_serve_one_request(gpu_stack, tiny_llama: Path, tmp_path: Path) -> None:
    trtllm_version, examples = gpu_stack
    (tmp_path / "routes").mkdir()
    (tmp_path / "routes" / "copy.jsonl").write_text(
        json.dumps({"prompt": "one two three one two three one two"}) + "\n"
    )
    spec = tmp_path / "gpu.yaml"
    spec.write_text(f"""\
name: gpu-smoke
backend: tensorrt_llm
stack: {{trtllm_version: "{trtllm_version}", examples_dir: {examples}}}
target: {{model: {tiny_llama}, family: llama, dtype: float16, max_batch_size: 2,
         max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4, num_draft_tokens: [4]}}
routes:
  copy: {{prompts: routes/copy.jsonl, max_tokens: 16}}
bench: {{concurrency: [1], temperatures: [0.0], warmup_requests: 0, requests_per_route: 1}}
""")
    engines, repo, run = tmp_path / "engines", tmp_path / "repo", tmp_path / "run"
    _run("build", str(spec), "--engines", str(engines))
    _run("repo", str(spec), "--engines", str(engines), "--output", str(repo))
    _run(
        "bench", str(spec), "--engines", str(engines), "--repo", str(repo / "gpu-smoke"),
        "--run-dir", str(run), "--fixed-count", "--no-plots", "--format", "json",
    )  # fmt: skip
    rows = [r for r in read_requests(run / "requests.jsonl") if not r["warmup"]]
    assert {r["variant"] for r in rows} == {"baseline", "ngram"}
    assert all(r["error"] is None and r["completion_tokens"] == 16 for r in rows), rows
    by = {r["variant"]: r for r in rows}
    # lossless at temperature 0 on the real engine too
    assert by["ngram"]["output_ids_hash"] == by["baseline"]["output_ids_hash"]
