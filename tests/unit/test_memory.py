"""The GPU memory plan (trtspec.memory) and its CLI surface: weights and KV
bytes from a model's config.json against the published sizes of real models,
the fit verdicts and the split they suggest, the KV-cache fractions written
into the engine configs, and `--gpu-memory` on validate, build --dry-run and
repo."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.memory import (
    GIB,
    PROCESS_RESERVE_BYTES,
    MemoryPlanError,
    ModelShape,
    memory_plan,
    parse_size,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "model_configs"


def published(name: str) -> tuple[ModelShape, int]:
    cfg = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    return ModelShape.from_config(cfg), int(cfg["_published_weights_bytes"])


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("llama-2-7b-hf", "float16"),
        ("qwen2.5-7b-instruct", "bfloat16"),
        ("mistral-7b-v0.1", "bfloat16"),
    ],
)
def test_weights_match_the_published_checkpoint_size(name: str, dtype: str) -> None:
    shape, size = published(name)
    estimate = shape.weight_bytes(dtype)
    assert abs(estimate - size) / size < 0.05, (estimate, size)


def test_parameter_counts_and_kv_bytes_per_token() -> None:
    llama, _ = published("llama-2-7b-hf")
    qwen, _ = published("qwen2.5-7b-instruct")
    mistral, _ = published("mistral-7b-v0.1")
    # the model cards' 6.74B / 7.61B / 7.24B parameters
    assert round(llama.parameters() / 1e9, 2) == 6.74
    assert round(qwen.parameters() / 1e9, 2) == 7.62
    assert round(mistral.parameters() / 1e9, 2) == 7.24
    # 2 (K and V) x layers x kv_heads x head_dim x 2 bytes
    assert llama.kv_bytes_per_token("float16") == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert qwen.kv_bytes_per_token("bfloat16") == 2 * 28 * 4 * 128 * 2
    assert mistral.kv_bytes_per_token("float16") == 2 * 32 * 8 * 128 * 2


def test_weight_quantization_shrinks_the_linear_layers_only() -> None:
    llama, size = published("llama-2-7b-hf")
    embed_and_head = 2 * 32000 * 4096 * 2
    int8 = llama.weight_bytes("float16", "int8_wo")
    int4 = llama.weight_bytes("float16", "int4_wo")
    assert int8 == pytest.approx((size - embed_and_head) / 2 + embed_and_head, rel=0.001)
    assert int4 == pytest.approx((size - embed_and_head) / 4 + embed_and_head, rel=0.001)
    assert llama.weight_bytes("float16", "fp8") == int8
    assert llama.weight_bytes("float16", "int4_awq") > int4  # one fp16 scale per 128
    assert llama.weight_bytes("float32") == pytest.approx(2 * size, rel=0.001)


def test_sizes_and_their_errors() -> None:
    assert parse_size("80GiB") == 80 * GIB
    assert parse_size("141GB") == 141 * 10**9
    assert parse_size("24576 MiB") == 24 * GIB
    with pytest.raises(MemoryPlanError) as err:
        parse_size("80")
    assert (err.value.message, err.value.hint) == (
        "GPU memory '80' is not a size",
        "write a number and a unit, e.g. 80GiB, 141GB or 24576MiB",
    )


def test_unreadable_config_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(MemoryPlanError) as err:
        ModelShape.from_config({"hidden_size": 64}, str(tmp_path / "config.json"))
    assert err.value.message == (
        f"{tmp_path / 'config.json'}: not a decoder config the memory plan can read "
        "(KeyError('num_attention_heads') missing or bad)"
    )


# ------------------------------------------------------------------ a spec

SPEC = """\
name: mem
backend: tensorrt_llm
target: {model: ./llama, family: llama, dtype: float16, max_batch_size: 8, max_input_len: 3072,
         max_seq_len: 4096, max_num_tokens: 8192,
         kv_cache: {tokens_per_block: 64, free_gpu_mem_fraction: 0.9}}
variants:
  - {name: draft, mode: draft_model, draft: {model: ./tiny, family: llama}, max_draft_len: 4}
  - {name: lookahead, mode: lookahead, window_size: 4, ngram_size: 3, verification_set_size: 4}
"""
# TinyLlama-1.1B's config.json (TinyLlama/TinyLlama-1.1B-Chat-v1.0 on the Hub)
TINY = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
    "model_type": "llama",
}


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(
        (DATA / "llama-2-7b-hf.json").read_text(encoding="utf-8"), encoding="utf-8"
    )
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY), encoding="utf-8")
    path = tmp_path / "mem.yaml"
    path.write_text(SPEC, encoding="utf-8")
    return path


def _plan(spec_path: Path, gpu: int | None):
    from trtspec.plan import make_plan
    from trtspec.spec import load_spec

    spec = load_spec(spec_path)
    plan = make_plan(spec, spec_path.parent / "engines")
    return spec, plan, memory_plan(spec, plan, gpu)


def test_engine_estimates_and_servers(spec_path: Path) -> None:
    _, _, mp = _plan(spec_path, 80 * GIB)
    target = mp.engine("target")
    assert target.weights == published("llama-2-7b-hf")[0].weight_bytes("float16")
    assert target.kv_per_token == 512 * 1024
    assert target.kv_min == 4096 * 512 * 1024  # one max_seq_len sequence: 2 GiB
    assert target.kv_full == 8 * target.kv_min  # max_batch_size of them
    assert [(f.name, f.engines) for f in mp.fits] == [
        ("repository", ["target", "target_dte", "draft_tiny", "target_lookahead_lookahead"]),
        ("baseline", ["target"]),
        ("draft", ["target_dte", "draft_tiny"]),
        ("lookahead", ["target_lookahead_lookahead"]),
    ]
    assert [f.verdict for f in mp.fits] == ["fits, smaller KV cache", "fits", "fits", "fits"]


def test_fractions_never_overcommit_whatever_the_load_order(spec_path: Path) -> None:
    _, _, mp = _plan(spec_path, 80 * GIB)
    repo = mp.fits[0]
    pool = (80 * GIB - repo.fixed) * 0.9
    taken = 0.0
    for e in mp.engines:
        free_when_first = 80 * GIB - PROCESS_RESERVE_BYTES - e.fixed
        # loaded first, the engine takes at most its share of the pool ...
        taken += mp.fractions[e.name] * free_when_first
    # ... so all of them together never take more than the pool
    assert taken <= pool
    assert taken > 0.9 * pool  # and the pool is not wasted (rounding, the 0.01 floor)


def test_warning_names_the_split_that_fits(spec_path: Path) -> None:
    _, _, mp = _plan(spec_path, 48 * GIB)
    assert mp.warnings() == [
        "the repository's 4 engines need at least 50.9 GiB but the GPU has 48.0 GiB; each "
        "of baseline, draft, lookahead fits alone: benchmark with `trtspec bench --isolate` "
        "(one server per variant)"
    ]
    # the fractions are then sized for one variant per server
    assert mp.fractions["target"] == 0.9
    _, _, small = _plan(spec_path, 18 * GIB)
    assert small.warnings() == [
        "the repository's 4 engines need at least 50.9 GiB but the GPU has 18.0 GiB; each "
        "of baseline, lookahead fits alone: benchmark with `trtspec bench --isolate` (one "
        "server per variant); variant draft alone needs 19.6 GiB: drop it, quantize, or "
        "raise target.tp"
    ]
    _, _, roomy = _plan(spec_path, 141 * GIB)
    assert roomy.warnings() == []


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args))


def test_validate_prints_the_plan_and_warns(spec_path: Path) -> None:
    res = run("validate", str(spec_path), "--gpu-memory", "48GiB")
    assert res.exit_code == 0, res.output
    assert res.stderr == (
        "Warning: the repository's 4 engines need at least 50.9 GiB but the GPU has 48.0 GiB; "
        "each of baseline, draft, lookahead fits alone: benchmark with `trtspec bench "
        "--isolate` (one server per variant)\n"
    )
    out = res.stdout.split("\n\n", 1)[1].splitlines()
    assert out[0] == "GPU memory plan (estimate per GPU; GPU 48.0 GiB)"
    assert out[3].split() == ["target", "12.6", "GiB", "512", "KiB", "16.0", "GiB", "0.9000"]
    assert out[5].split()[:3] == ["draft_tiny", "2.0", "GiB"]
    assert res.stdout.splitlines()[-4].split() == [
        "repository",
        "4",
        "50.9",
        "GiB",
        "94.0",
        "GiB",
        "does",
        "not",
        "fit",
    ]
    data = json.loads(
        run("validate", str(spec_path), "--gpu-memory", "48GiB", "--format", "json").stdout
    )
    assert data["memory"]["gpu_memory_bytes"] == 48 * GIB
    assert [s["verdict"] for s in data["memory"]["servers"]] == [
        "does not fit",
        "fits",
        "fits",
        "fits",
    ]
    assert data["memory"]["engines"][0]["weights_bytes"] == 13476831232


def test_bad_gpu_memory_is_a_usage_error(spec_path: Path) -> None:
    res = run("build", str(spec_path), "--dry-run", "--gpu-memory", "lots")
    assert res.exit_code == 2
    assert res.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--gpu-memory': GPU memory 'lots' is not a size; write a "
        "number and a unit, e.g. 80GiB, 141GB or 24576MiB"
    )


def test_dry_run_shows_the_plan_without_a_gpu_size(spec_path: Path) -> None:
    res = run("build", str(spec_path), "--dry-run", "--engines", str(spec_path.parent / "e"))
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    assert "GPU memory plan (estimate per GPU; no --gpu-memory given)" in res.stdout
    # no GPU size: the spec's 0.9 is split by KV need (the draft's is small)
    rows = {line.split()[0]: line.split() for line in res.stdout.splitlines() if line}
    # KV need: target 16 GiB (4096 tokens); target_dte and lookahead are built
    # with max_seq_len 4096 + 4 and 4096 + 15 (trtllm-build adds max_draft_len),
    # 65 blocks of 64 = 4160 tokens x 512 KiB x 8 = 16.25 GiB each; the draft
    # 0.6875 GiB. Total 49.1875 GiB; 0.9 x 16 / 49.1875, 0.9 x 16.25 / 49.1875,
    # 0.9 x 0.6875 / 49.1875, rounded down:
    assert rows["target"][-1] == "0.2927"
    assert rows["target_dte"][-1] == rows["target_lookahead_lookahead"][-1] == "0.2973"
    assert rows["draft_tiny"][-1] == "0.0125"
    assert rows["repository"][-1] == "-"


def test_unknown_models_are_listed_not_guessed(tmp_path: Path) -> None:
    from tests.fixtures.specs import copy_example

    res = run(
        "validate",
        str(copy_example(tmp_path, "vicuna-7b.yaml")),
        "--gpu-memory",
        "80GiB",
        "--format",
        "json",
    )
    assert res.exit_code == 0, res.output
    memory = json.loads(res.stdout)["memory"]
    assert memory["known"] is False and memory["warnings"] == []
    assert {e["note"] for e in memory["engines"]} == {
        "config.json not on this machine (build downloads it)"
    }
    assert {s["verdict"] for s in memory["servers"]} == {"unknown"}


def test_repo_writes_the_planned_fractions(spec_path: Path, tmp_path: Path) -> None:
    from trtspec.repo.assemble import assemble
    from trtspec.repo.configs import parameters_of, read_config

    spec, plan, mp = _plan(spec_path, 80 * GIB)
    repo = assemble(
        spec,
        plan,
        spec_path.parent / "engines",
        tmp_path / "repo",
        require_engines=False,
        memory=mp,
    )
    for name, fraction in mp.fractions.items():
        params = parameters_of(read_config(repo / name / "config.pbtxt"))
        assert params["kv_cache_free_gpu_mem_fraction"] == str(fraction)
    assert mp.fractions["target"] == 0.1577


def test_repo_command_takes_gpu_memory(
    spec_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import trtspec.memory
    from trtspec.repo.configs import parameters_of, read_config

    made: list[int | None] = []

    def counted(spec, plan, gpu_bytes=None):  # type: ignore[no-untyped-def]
        made.append(gpu_bytes)
        return memory_plan(spec, plan, gpu_bytes)

    monkeypatch.setattr(trtspec.memory, "memory_plan", counted)

    engines = tmp_path / "engines"
    # engine folders as trtllm-build leaves them, as far as `repo` reads them
    for name, draft_len in (
        ("target", 0),
        ("target_dte", 4),
        ("draft_tiny", 0),
        ("target_lookahead_lookahead", 15),
    ):
        (engines / "mem" / name).mkdir(parents=True)
        (engines / "mem" / name / "config.json").write_text(
            json.dumps({"build_config": {"max_draft_len": draft_len}}), encoding="utf-8"
        )
    (engines / "mem" / "target" / "tokenizer").mkdir()
    from trtspec.artifacts.plan import save_plan
    from trtspec.plan import make_plan
    from trtspec.spec import load_spec

    spec = load_spec(spec_path)
    save_plan(spec, make_plan(spec, engines))  # and the plan `trtspec build` writes
    res = run(
        "repo",
        str(spec_path),
        "--engines",
        str(engines),
        "--output",
        str(tmp_path / "out"),
        "--gpu-memory",
        "48GiB",
        "--format",
        "json",
    )
    assert res.exit_code == 0, res.output
    assert made == [48 * GIB]  # planned once: its warnings and the fractions alike
    assert (
        "Warning: the repository's 4 engines need at least 50.9 GiB but the GPU has "
        "48.0 GiB" in res.stderr
    )
    config = read_config(tmp_path / "out" / "mem" / "target_dte" / "config.pbtxt")
    _, _, mp = _plan(spec_path, 48 * GIB)
    assert (
        parameters_of(config)["kv_cache_free_gpu_mem_fraction"]
        == str(mp.fractions["target_dte"])
        == "0.7897"
    )
