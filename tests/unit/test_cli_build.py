"""``trtspec validate`` and ``trtspec build`` through Click: exit codes, stdout
(data) and stderr (errors, warnings, progress) checked apart, and a real
reference-backend build of the tiny model that a second run skips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fixtures.every_mode import in_process_builds
from tests.fixtures.specs import LIMITS, copy_example

from trtspec.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]


def example(tmp_path: Path, name: str) -> Path:
    return copy_example(tmp_path, name)


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args))


def test_validate_table(tmp_path: Path) -> None:
    spec = example(tmp_path, "vicuna-7b.yaml")
    res = run("validate", str(spec))
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    lines = res.stdout.splitlines()
    assert lines[0] == f"{spec}: valid (vicuna-7b, backend tensorrt_llm, TensorRT-LLM 1.1.0)"
    assert lines[1].split() == [
        "variant",
        "mode",
        "max_draft_len",
        "target",
        "engine",
        "draft",
        "engine",
    ]
    assert lines[3].split() == ["baseline", "none", "-", "target", "-"]
    assert lines[5].split() == ["ngram", "ngram", "8", "target_dte", "-"]
    assert lines[8].split() == ["lookahead", "lookahead", "15", "target_lookahead_lookahead", "-"]


def test_validate_json(tmp_path: Path) -> None:
    res = run("validate", str(example(tmp_path, "qwen2.5-7b.yaml")), "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["valid"] is True and data["spec"] == "qwen2.5-7b" and data["warnings"] == []
    assert [v["name"] for v in data["variants"]] == ["baseline", "draft", "ngram", "lookahead"]
    assert data["variants"][1] == {
        "name": "draft",
        "mode": "draft_model",
        "max_draft_len": 8,
        "target": "target_dte",
        "draft": "draft_qwen2.5-0.5b-instruct",
    }


def test_validate_error_exit_1(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntarget: {model: org/m, family: lama}\n")
    res = run("validate", str(spec))
    assert res.exit_code == 1
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: {spec}:2:32: target.family: 'lama' is not allowed; use one of 'llama', "
        "'mistral', 'mixtral' or 'qwen2'\n"
        "Hint: fix the fields named above; `trtspec validate` rechecks\n"
    )


def test_validate_several_errors(tmp_path: Path) -> None:
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntarget: {model: org/m, family: llama, tp: 0}\nbogus: 1\n")
    res = run("validate", str(spec))
    assert res.exit_code == 1
    assert res.stderr == (
        "Error: 2 problems in the spec:\n"
        f"  {spec}:2:43: target.tp: input should be greater than or equal to 1 (got 0)\n"
        f"  {spec}:3:1: bogus: unknown key 'bogus'; remove it; allowed keys: name, stack, backend, "
        "flow, target, variants, routes, bench, rollout, router\n"
        "Hint: fix the fields named above; `trtspec validate` rechecks\n"
    )


def test_validate_warning_on_stderr(tmp_path: Path) -> None:
    spec = tmp_path / "w.yaml"
    spec.write_text(
        'name: x\nstack: {trtllm_version: "1.0.0", triton_image: '
        "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3}\n"
        "target: {model: org/m, family: llama}\n"
    )
    res = run("validate", str(spec))
    assert res.exit_code == 0, res.output
    assert res.stderr == (
        "Warning: stack.triton_image nvcr.io/nvidia/tritonserver:25.12-trtllm-"
        "python-py3 ships TensorRT-LLM 1.1.0, not 1.0.0\n"
    )
    assert res.stdout.startswith(f"{spec}: valid (x,")


def test_validate_usage_error_exit_2() -> None:
    res = run("validate")
    assert res.exit_code == 2
    assert "Missing argument 'SPEC'" in res.stderr


def test_dry_run_json_every_mode(tmp_path: Path) -> None:
    spec = example(tmp_path, "vicuna-7b.yaml")
    res = run(
        "build",
        str(spec),
        "--dry-run",
        "--format",
        "json",
        "--engines",
        str(tmp_path / "engines"),
    )
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    data = json.loads(res.stdout)
    e = f"{tmp_path}/engines/vicuna-7b"
    steps = {s["id"]: s for s in data["steps"]}
    assert not any(s["cached"] for s in data["steps"])
    assert steps["build:target_eagle_eagle"]["argv"] == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{e}/.checkpoints/target_eagle_eagle",
        "--output_dir",
        f"{e}/target_eagle_eagle",
        *LIMITS,
        "--output_timing_cache",
        f"{e}/target_eagle_eagle/model.cache",
        "--speculative_decoding_mode",
        "eagle",
        "--max_draft_len",
        "10",
    ]
    assert {e["name"]: e["speculative_decoding_mode"] for e in data["engines"]} == {
        "target": 1,
        "target_dte": 2,
        "draft_vicuna-68m": 1,
        "target_medusa_medusa": 4,
        "target_eagle_eagle": 32,
        "target_lookahead_lookahead": 8,
    }
    assert data["variants"]["baseline"] == {"target": "target", "draft": None, "mode": "none"}


def test_dry_run_table_and_only(tmp_path: Path) -> None:
    spec = example(tmp_path, "vicuna-7b.yaml")
    res = run("build", str(spec), "--dry-run", "--only", "ngram")
    assert res.exit_code == 0, res.output
    steps, memory = res.stdout.split("\n\n", 1)  # the GPU memory plan follows the steps
    lines = steps.splitlines()
    assert lines[0].split() == ["#", "unit", "kind", "state", "command"]
    assert memory.startswith("GPU memory plan (estimate per GPU; no --gpu-memory given)")
    assert [ln.split()[1:4] for ln in lines[2:]] == [
        [".sources/vicuna-7b-v1.3", "download", "run"],
        [".checkpoints/target", "convert", "run"],
        ["target_dte", "build", "run"],
        ["target_dte", "tokenizer", "run"],
    ]


def test_only_unknown_variant_exit_2(tmp_path: Path) -> None:
    res = run("build", str(example(tmp_path, "vicuna-7b.yaml")), "--dry-run", "--only", "ngarm")
    assert res.exit_code == 2
    assert res.stdout == ""
    assert (
        "Invalid value for '--only': no variant named 'ngarm' (variants: baseline, draft, "
        "ngram, medusa, eagle, lookahead). Did you mean 'ngram'?"
    ) in res.stderr


def test_gpu_build_outside_container_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    res = run(
        "build",
        str(example(tmp_path, "small-ngram.yaml")),
        "--engines",
        str(tmp_path / "engines"),
    )
    assert res.exit_code == 1
    assert res.stdout == ""
    assert res.stderr == (
        "Error: trtllm-build is not on PATH; TensorRT-LLM engines can only be built where "
        "TensorRT-LLM is installed\n"
        "Hint: run inside the Triton TRT-LLM container (see stack.triton_image), use `trtspec "
        "build --dry-run` to see the commands, or set backend: reference\n"
    )
    assert not (tmp_path / "engines" / "small-ngram" / "target").exists()


@pytest.mark.slow
def test_reference_build_then_cached_then_inspect(tmp_path: Path, tiny_llama: Path) -> None:
    """The CLI's build, cache and inspect, with the reference steps run in
    process (the same argv; the subprocess itself is test_reference_build's
    and the e2e tests')."""
    with in_process_builds():
        _build_then_cached_then_inspect(tmp_path, tiny_llama)


def _build_then_cached_then_inspect(tmp_path: Path, tiny_llama: Path) -> None:
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        f"name: tiny\nbackend: reference\n"
        f"target: {{model: {tiny_llama}, family: llama, max_batch_size: 2, max_input_len: 64,"
        f" max_seq_len: 128}}\n"
        "variants:\n  - {name: ngram, mode: ngram, max_draft_len: 4}\n"
    )
    engines = tmp_path / "engines"
    res = run("build", str(spec), "--engines", str(engines), "--format", "json")
    assert res.exit_code == 0, res.output
    first = json.loads(res.stdout)
    assert [(e["name"], e["state"]) for e in first["engines"]] == [
        ("target", "built"),
        ("target_dte", "built"),
    ]
    assert "[1/2] reference engine target ..." in res.stderr
    for name in ("target", "target_dte"):
        assert (engines / "tiny" / name / "config.json").is_file()
        assert (engines / "tiny" / name / "trtspec.json").is_file()
        assert (engines / "tiny" / name / "build.log").is_file()

    res = run("build", str(spec), "--engines", str(engines))
    assert res.exit_code == 0, res.output
    assert res.stderr.splitlines() == [
        "[1/2] reference engine target: cached",
        "[2/2] reference engine target_dte: cached",
    ]
    assert [ln.split()[3] for ln in res.stdout.splitlines()[2:]] == ["cached", "cached"]

    res = run("inspect", str(engines / "tiny" / "target_dte"), "--format", "json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["speculative_decoding_mode"] == 2 and info["max_draft_len"] == 4
    assert info["manifest"]["steps"] == ["reference:target_dte"]


def test_an_unknown_key_in_any_section_lists_the_sections_keys(tmp_path: Path) -> None:
    # every nested section of the schema is known to the checks, so a typo
    # anywhere names the keys that section allows (router and rollout.log
    # once listed none)
    import typing

    from pydantic import BaseModel

    from trtspec.spec.checks import _SECTIONS
    from trtspec.spec.schema import Spec

    def sections(model: type[BaseModel], path: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = []
        for name, field in model.model_fields.items():
            kind = field.annotation
            args = typing.get_args(kind)
            if typing.get_origin(kind) is dict and args:
                kind, step = args[-1], (name, "*")
            else:
                step = (name,)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found += [(*path, *step), *sections(kind, (*path, *step))]
        return found

    missing = [p for p in sections(Spec, ()) if p not in _SECTIONS]
    assert not missing, missing
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\ntarget: {model: org/m, family: llama}\nrouter: {processes: 2}\n")
    res = run("validate", str(spec))
    assert res.exit_code == 1
    assert "router.processes: unknown key 'processes'; remove it; allowed keys: instances" in (
        res.stderr
    )
