"""The ``tensorrt_llm`` build path end to end on a CPU machine, through the
CLI, with a recording fake ``trtllm-build`` on PATH and fake converter
scripts in an ``--examples-dir`` (tests/fixtures/fake_trtllm.py): the
missing-script preflight error, the exact argv each tool receives (the
``--dry-run`` plan, with the output folders staged), ``-v`` echoing the
tools' output, manifests read back by ``inspect``, a cached second build and
``--force``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fixtures.fake_trtllm import MODE_INTS, install_fake_trtllm

from trtspec.cli.main import cli

SPEC = """\
name: gpu-path
backend: tensorrt_llm
stack: {{trtllm_version: "1.1.0", examples_dir: /nonexistent/examples}}
target: {{model: {model}, family: llama, dtype: float16, max_batch_size: 2,
         max_input_len: 64, max_seq_len: 128, max_num_tokens: 256}}
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4}}
"""


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args))


@pytest.fixture
def setup(tmp_path: Path, tiny_llama: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    fake = install_fake_trtllm(tmp_path / "fake")
    monkeypatch.setenv("PATH", f"{fake.bin_dir}{os.pathsep}{os.environ['PATH']}")
    spec = tmp_path / "gpu.yaml"
    spec.write_text(SPEC.format(model=tiny_llama))
    return fake, spec, tmp_path / "engines"


def test_missing_converter_script_is_a_preflight_error(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    fake, spec, engines = setup
    res = run("build", str(spec), "--engines", str(engines))
    assert res.exit_code == 1, res.output
    script = "/nonexistent/examples/models/core/llama/convert_checkpoint.py"
    assert res.stderr == (
        f"Error: {script} does not exist (needed by step convert:target)\n"
        "Hint: set stack.examples_dir (or --examples-dir) to the TensorRT-LLM examples "
        "folder of the pinned version\n"
    )
    assert fake.calls() == [] and not (engines / "gpu-path" / "target").exists()


def test_build_runs_the_planned_argv_then_caches_then_forces(setup) -> None:  # type: ignore[no-untyped-def]
    fake, spec, engines = setup
    common = ("--engines", str(engines), "--examples-dir", str(fake.examples_dir))
    res = run("build", str(spec), *common, "--dry-run", "--format", "json")
    assert res.exit_code == 0, res.output
    planned = [s for s in json.loads(res.stdout)["steps"] if s["kind"] in ("convert", "build")]
    assert [s["kind"] for s in planned] == ["convert", "build", "build"]
    assert planned[0]["argv"][:2] == [
        "python",
        f"{fake.examples_dir}/models/core/llama/convert_checkpoint.py",
    ]

    res = run("build", str(spec), *common, "-v", "--format", "json")
    assert res.exit_code == 0, res.output
    calls = fake.calls()
    assert [c["tool"] for c in calls] == ["convert_checkpoint.py"] + ["trtllm-build"] * 2
    for step, call in zip(planned, calls, strict=True):
        want = step["argv"][2:] if step["kind"] == "convert" else step["argv"][1:]
        got = list(call["argv"])
        # the executor writes into a staging folder and renames it: same argv otherwise
        out = want.index("--output_dir") + 1
        staged = got[out]
        assert "/.staging/" in staged, got
        got = [a.replace(staged, want[out]) for a in got]
        assert got == want, step["id"]
    # -v: each tool's output on stderr, as it ran
    assert res.stderr.count("fake trtllm-build: engine written to ") == 2, res.stderr
    assert "fake convert_checkpoint.py: checkpoint written to " in res.stderr
    assert {s["status"] for s in json.loads(res.stdout)["steps"]} == {"ran"}

    # the engines are read back like real ones, mode integers included
    modes = {}
    for name in ("target", "target_dte"):
        res = run("inspect", str(engines / "gpu-path" / name), "--format", "json")
        assert res.exit_code == 0, res.output
        modes[name] = json.loads(res.stdout)
    assert modes["target"]["speculative_mode_name"] == "none"
    dte = modes["target_dte"]
    assert (dte["speculative_decoding_mode"], dte["speculative_mode_name"]) == (
        MODE_INTS["draft_tokens_external"],
        "draft_tokens_external",
    )
    assert (dte["max_draft_len"], dte["max_batch_size"], dte["tp_size"]) == (4, 2, 1)
    assert dte["files"] == [
        "build.log",
        "config.json",
        "model.cache",
        "rank0.engine",
        "trtspec.json",
    ]
    assert dte["manifest"]["backend"] == "tensorrt_llm"
    assert dte["files_check"].startswith("ok: ")

    # unchanged: nothing runs; --force: everything runs again
    res = run("build", str(spec), *common, "--format", "json")
    assert res.exit_code == 0, res.output
    assert {s["status"] for s in json.loads(res.stdout)["steps"]} == {"cached"}
    assert len(fake.calls()) == 3
    res = run("build", str(spec), *common, "--force", "--format", "json")
    assert res.exit_code == 0, res.output
    assert {s["status"] for s in json.loads(res.stdout)["steps"]} == {"ran"}
    assert [c["tool"] for c in fake.calls()[3:]] == [c["tool"] for c in calls]
