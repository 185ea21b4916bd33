"""Engine-flow fidelity (issue 21): what `trtspec build --dry-run` plans for
the cases that only misbehave on a real GPU, checked against the upstream
source each rule follows (cited beside each test), and the memory plan of an
EAGLE and a draft-model spec against a hand computation from the values
trtllm-build really builds with.

Model shapes: Llama-2-7B's config.json (tests/data/model_configs, as
published on the Hub: 32 layers, hidden 4096, intermediate 11008, 32 heads, 32
KV heads, head_dim 128, vocab 32000, untied) for the target; small made-up
Llama configs for drafts and the EAGLE layer, written below."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from tests.fixtures import cpp_params

from trtspec.cli.main import cli
from trtspec.memory import ENGINE_RESERVE_BYTES, PROCESS_RESERVE_BYTES
from trtspec.serve.launch import orchestrator_mode_argv, visible_gpus
from trtspec.versions import default_examples_dir

DATA = Path(__file__).resolve().parents[1] / "data" / "model_configs"
LLAMA_7B_WEIGHTS = 13_476_831_232  # fp16 bytes (test_memory checks it against the Hub)

# A 1.1B-class Llama draft with 2 KV heads (TinyLlama's shape, KV heads 4 -> 2):
# at tp 4 each rank holds ceil(2/4) = 1 replicated KV head.
SMALL = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 2,
    "vocab_size": 32000,
    "model_type": "llama",
}
# Qwen2.5-0.5B's attention shape (14 heads, 2 KV heads) with the target's vocabulary.
ODD = {**SMALL, "hidden_size": 896, "num_attention_heads": 14, "intermediate_size": 4864}
# An EAGLE-1 checkpoint's config: one decoder layer (eagle_net_config).
EAGLE = {**json.loads((DATA / "llama-2-7b-hf.json").read_text()), "num_hidden_layers": 1}


def folder(root: Path, name: str, config: dict) -> None:  # type: ignore[type-arg]
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "config.json").write_text(json.dumps(config), encoding="utf-8")


@pytest.fixture
def models(tmp_path: Path) -> Path:
    folder(tmp_path, "llama", json.loads((DATA / "llama-2-7b-hf.json").read_text()))
    folder(tmp_path, "small", SMALL)
    folder(tmp_path, "odd", ODD)
    folder(tmp_path, "eagle", EAGLE)
    folder(tmp_path, "qwen", {**SMALL, "model_type": "qwen2"})
    folder(tmp_path, "heads", {"medusa_num_heads": 4})
    return tmp_path


def write(root: Path, text: str) -> Path:
    path = root / "s.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def dry_run(spec: Path):  # type: ignore[no-untyped-def]
    res = CliRunner().invoke(
        cli,
        ["build", str(spec), "--dry-run", "--format", "json", "--engines", str(spec.parent / "e")],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def errors(spec: Path) -> list[str]:
    """The spec errors of `build --dry-run`, without their file:line:col."""
    res = CliRunner().invoke(cli, ["build", str(spec), "--dry-run"])
    assert res.exit_code == 1, res.output
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert lines[-1] == "Hint: fix the fields named above; `trtspec validate` rechecks"
    where = re.escape(str(spec)) + r":\d+:\d+: "
    return [re.sub(r"^(Error: |  )" + where, "", line) for line in lines[:-1] if str(spec) in line]


def step(data: dict, step_id: str) -> list[str]:  # type: ignore[type-arg]
    return next(s["argv"] for s in data["steps"] if s["id"] == step_id)


def engine(data: dict, name: str) -> dict:  # type: ignore[type-arg]
    return next(e for e in data["memory"]["engines"] if e["engine"] == name)


DRAFT_SPEC = """\
name: dm
target: {model: ./llama, family: llama, dtype: float16, tp: 4, max_batch_size: 4,
         max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 2048,
         kv_cache: {tokens_per_block: 32}}
variants:
  - {name: dm, mode: draft_model, max_draft_len: 8, use_draft_logits: true,
     draft: {model: ./small, family: llama, tp: 4}}
"""


# ------------------------------------------------------------- (2) and (3)


def test_draft_logits_gather_on_both_engines_and_the_draft_keeps_its_own_tp(
    models: Path,
) -> None:
    """examples/draft_target_model/README.md (TensorRT-LLM @11925f62, 0.18.0):
    "--gather_generation_logits is necessary if using generation logits for
    selecting tokens in target model"; the draft's device list has "the TP size
    of the draft model engine"."""
    data = dry_run(write(models, DRAFT_SPEC))
    e = f"{models}/e/dm"
    assert step(data, "build:target_dte")[-5:] == [
        "--speculative_decoding_mode",
        "draft_tokens_external",
        "--max_draft_len",
        "8",
        "--gather_generation_logits",
    ]
    assert step(data, "build:draft_small_tp4pp1")[-1] == "--gather_generation_logits"
    assert step(data, "build:target")[-1] == f"{e}/target/model.cache"  # the baseline does not
    assert step(data, "convert:draft_small_tp4pp1") == [
        "python",
        "/app/examples/models/core/llama/convert_checkpoint.py",
        "--model_dir",
        f"{models}/small",
        "--output_dir",
        f"{e}/.checkpoints/draft_small_tp4pp1",
        "--dtype",
        "float16",
        "--tp_size",
        "4",
        "--pp_size",
        "1",
    ]
    # Orchestrator mode: each engine model names its GPUs; the draft shares the target's.
    assert {x["name"]: x["devices"] for x in data["engines"]} == {
        "target": [[0, 1, 2, 3]],
        "target_dte": [[0, 1, 2, 3]],
        "draft_small_tp4pp1": [[0, 1, 2, 3]],
    }
    assert data["memory"]["gpus"] == 4


def test_draft_tp_must_split_its_heads(models: Path) -> None:
    """tensorrt_llm/models/convert_utils.py @9b3c7124: split() needs heads %
    tp == 0, dup_kv_weight asserts tp % kv_heads == 0 when TP exceeds them."""
    spec = write(
        models,
        DRAFT_SPEC.replace("./small, family: llama, tp: 4", "./odd, family: llama, tp: 4"),
    )
    assert errors(spec) == [
        "variants[0].draft.tp: the draft (14 heads, 2 KV heads) cannot be converted with tp 4: "
        "its 14 attention heads do not split evenly over tp 4; set tp to one of 1, 2"
    ]
    spec = write(models, DRAFT_SPEC.replace("family: llama, tp: 4}", "family: llama, tp: 8}"))
    assert errors(spec) == [
        "variants[0].draft.tp: the draft's tp×pp = 8 is more than the target's 4 GPUs; give "
        "the draft at most 4 (a draft is the smaller model)"
    ]


def test_target_tp_must_split_its_heads(models: Path) -> None:
    spec = write(
        models,
        """\
        name: t
        target: {model: ./odd, family: llama, tp: 4}
        """,
    )
    assert errors(spec) == [
        "target.tp: the target (14 heads, 2 KV heads) cannot be converted with tp 4: its 14 "
        "attention heads do not split evenly over tp 4; set tp to one of 1, 2, 14"
    ]


# ------------------------------------------------------------------ (1)


def test_instances_get_gpus_of_their_own(models: Path, tmp_path: Path) -> None:
    """model_instance_state.cc (tensorrtllm_backend v0.19.0): instance i takes
    gpu_device_ids entry i; docs/llama_multi_instance.md: "0,1;2,3"."""
    from trtspec.plan import make_plan
    from trtspec.repo.assemble import assemble
    from trtspec.repo.configs import parameters_of, read_config
    from trtspec.spec import load_spec

    text = DRAFT_SPEC.replace("tp: 4, max_batch_size", "instances: 2, max_batch_size").replace(
        "family: llama, tp: 4}", "family: llama}"
    )
    spec_path = write(models, text)
    data = dry_run(spec_path)
    assert {x["name"]: x["devices"] for x in data["engines"]} == {
        "target": [[0], [1]],
        "target_dte": [[0], [1]],
        "draft_small": [[0], [1]],
    }
    assert engine(data, "target")["instances"] == 2
    assert engine(data, "target")["gpu_device_ids"] == "0;1"
    # one copy of each engine on each of 2 GPUs: the per-GPU plan holds for both
    assert data["memory"]["gpus"] == 2
    spec = load_spec(spec_path)
    repo = assemble(
        spec,
        make_plan(spec, models / "e"),
        models / "e",
        tmp_path / "repo",
        require_engines=False,
    )
    for name in ("target", "target_dte", "draft_small"):
        config = read_config(repo / name / "config.pbtxt")
        assert config.instance_group[0].count == 2
        assert parameters_of(config)["gpu_device_ids"] == "0;1"
        # as model_state.cc parses it: one device list per instance
        assert cpp_params.id_groups(parameters_of(config)["gpu_device_ids"]) == [[0], [1]]
        assert cpp_params.problems(parameters_of(config), "1.1.0") == []


def test_instances_of_a_multi_gpu_engine_are_refused(models: Path) -> None:
    spec = write(
        models, DRAFT_SPEC.replace("tp: 4, max_batch_size", "tp: 4, instances: 2, max_batch_size")
    )
    assert errors(spec) == [
        "target.instances: 2 instances of a tp×pp = 4 engine need one tritonserver per copy "
        "(TensorRT-LLM's leader mode cannot place instances); set instances: 1, or tp: 1 and "
        "pp: 1 for one GPU per instance"
    ]


# ------------------------------------------------------------- (4), (6)


def test_qwen2_medusa_at_tp_above_1_is_refused(models: Path) -> None:
    """examples/medusa/convert_checkpoint.py (TensorRT-LLM @b93e14ca) loads Qwen2
    without a Mapping and saves the full weights for every rank."""
    spec = write(
        models,
        """\
        name: m
        target: {model: ./qwen, family: qwen2, tp: 2}
        variants:
          - {name: med, mode: medusa, checkpoint: ./heads, medusa_choices: [[0], [1]]}
        """,
    )
    assert errors(spec) == [
        "target.tp: Medusa variant 'med' on a qwen2 target cannot be converted at tp 2: "
        "TensorRT-LLM's Medusa converter writes the unsplit Qwen2 weights for every rank; "
        "set tp: 1, or a target.quantization (quantize.py shards by --tp_size), or drop the variant"
    ]
    # quantized, it goes through quantize.py, which converts per rank mapping
    data = dry_run(write(models, spec.read_text().replace("tp: 2}", "tp: 2, quantization: fp8}")))
    argv = step(data, "quantize:target_medusa_med")
    assert argv[argv.index("--tp_size") + 1] == "2"
    assert "--medusa_model_dir" in argv


def test_max_num_tokens_below_max_input_len_is_refused(models: Path) -> None:
    """microBatchScheduler.cpp (TensorRT-LLM @0a949d31): without chunking a
    context larger than what is left of max_num_tokens is never scheduled."""
    spec = write(
        models,
        """\
        name: t
        target: {model: ./llama, family: llama, max_input_len: 4096, max_seq_len: 8192,
                 max_num_tokens: 2048}
        """,
    )
    assert errors(spec) == [
        "target.max_num_tokens: 2048 is smaller than max_input_len (4096); with chunked "
        "context off a prompt of max_input_len tokens could never be scheduled: raise "
        "max_num_tokens to at least 4096 or lower max_input_len"
    ]


# ------------------------------------------------------------------ (7)


def test_version_dependent_defaults(models: Path) -> None:
    assert default_examples_dir("0.19.0") == "/app/tensorrt_llm/examples"
    assert default_examples_dir("1.0.0") == default_examples_dir("1.2.1") == "/app/examples"
    spec = write(
        models,
        """\
        name: old
        stack: {trtllm_version: "0.18.2"}
        target: {model: ./llama, family: llama}
        """,
    )
    assert step(dry_run(spec), "convert:target")[1] == (
        "/app/tensorrt_llm/examples/llama/convert_checkpoint.py"
    )


def test_cuda_memory_pool_flags_cover_every_visible_gpu(tmp_path: Path) -> None:
    """launch_triton_server.py (tensorrtllm_backend v0.19.0) adds
    --cuda-memory-pool-byte-size=j:0 for j in range(number_of_gpus())."""
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5,6"}, 2) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0"}, 2) == 2  # never fewer than the ranks
    smi = tmp_path / "nvidia-smi"
    smi.write_text('#!/bin/sh\nfor i in 0 1 2 3; do echo "GPU $i: NVIDIA H100 (UUID: x)"; done\n')
    smi.chmod(0o755)
    assert visible_gpus({"PATH": str(tmp_path)}, 2) == 4
    assert visible_gpus({"PATH": str(tmp_path / "none")}, 2) == 2
    assert orchestrator_mode_argv(["tritonserver"], gpus=4)[-4:] == [
        f"--cuda-memory-pool-byte-size={j}:0" for j in range(4)
    ]


# ------------------------------------------------------------ (5) by hand


def test_draft_model_memory_plan_matches_a_hand_computation(models: Path) -> None:
    data = dry_run(write(models, DRAFT_SPEC))

    # target_dte, built with max_draft_len 8 by trtllm-build (builder.py @14e801da):
    dte = engine(data, "target_dte")
    assert dte["max_seq_len"] == 2048 + 8 == 2056
    assert dte["max_num_tokens"] == max(2048, 4 * (8 + 1)) == 2048
    # per rank of tp 4: 2 (K, V) x 32 layers x ceil(32 / 4) = 8 KV heads x 128 x 2 bytes
    assert dte["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 == 131_072
    # ceil(2056 / 32) = 65 blocks of 32 tokens = 2080 tokens, x max_batch_size 4
    assert dte["kv_min_bytes"] == 65 * 32 * 131_072 == 272_629_760
    assert dte["kv_full_bytes"] == 4 * 272_629_760 == 1_090_519_040
    # gather engine: 2 float32 buffers of batch 4 x beam 1 x 8 steps x vocab 32000
    assert dte["logits_cache_bytes"] == 2 * 4 * 1 * 8 * 32000 * 4 == 8_192_000
    # (2048 tokens x (2 x 11008 + 4 x 4096) x 2 bytes + 4 x (8 + 1) x 32000 x 4) / 4 ranks
    assert dte["activation_bytes"] == (2048 * 38400 * 2 + 4 * 9 * 32000 * 4) // 4 == 40_473_600
    assert dte["weights_bytes"] == LLAMA_7B_WEIGHTS // 4 == 3_369_207_808
    assert dte["gpu_device_ids"] == "0,1,2,3"
    # the baseline's plain engine keeps the spec's 2048: 64 blocks
    assert engine(data, "target")["kv_min_bytes"] == 64 * 32 * 131_072

    # the draft at its own tp 4: 22 layers x ceil(2 / 4) = 1 (replicated) KV head x 64
    d = engine(data, "draft_small_tp4pp1")
    assert (d["gpus"], d["max_seq_len"], d["max_num_tokens"]) == (4, 2048, 2048)
    assert d["kv_bytes_per_token"] == 2 * 22 * 1 * 64 * 2 == 5632
    assert d["kv_min_bytes"] == 64 * 32 * 5632 == 11_534_336
    assert d["kv_full_bytes"] == 4 * 11_534_336
    assert d["logits_cache_bytes"] == 8_192_000
    assert d["activation_bytes"] == (2048 * (2 * 5632 + 4 * 2048) * 2 + 4 * 1 * 32000 * 4) // 4
    # linear per layer: 2048 x (2048 + 2 x 128) + 2048 x 2048 + 3 x 2048 x 5632 = 43,515,904;
    # x 22 layers, + embedding and head 2 x 32000 x 2048, + norms 22 x 2 x 2048 + 2048
    params = 22 * 43_515_904 + 2 * 32000 * 2048 + 22 * 2 * 2048 + 2048
    assert d["weights_bytes"] == params * 2 // 4 == 544_257_024

    # the variant's server, one GPU of the four: both engines' rank + the CUDA context
    server = next(s for s in data["memory"]["servers"] if s["name"] == "dm")
    fixed = (
        PROCESS_RESERVE_BYTES
        + (3_369_207_808 + 40_473_600 + 8_192_000 + ENGINE_RESERVE_BYTES)
        + (544_257_024 + d["activation_bytes"] + 8_192_000 + ENGINE_RESERVE_BYTES)
    )
    assert server["fixed_bytes"] == fixed
    assert server["need_min_bytes"] == fixed + 272_629_760 + 11_534_336
    assert server["need_full_bytes"] == fixed + 1_090_519_040 + 46_137_344


def test_eagle_memory_plan_matches_a_hand_computation(models: Path) -> None:
    data = dry_run(
        write(
            models,
            """\
            name: eg
            target: {model: ./llama, family: llama, dtype: float16, max_batch_size: 400,
                     max_input_len: 1024, max_seq_len: 2048, max_num_tokens: 2048,
                     kv_cache: {tokens_per_block: 32}}
            variants:
              - {name: eg, mode: eagle, checkpoint: ./eagle, num_eagle_layers: 3,
                 eagle_choices: [[0], [1], [0, 0], [0, 1], [0, 0, 0]]}
            """,
        )
    )
    e = engine(data, "target_eagle_eg")
    # max_draft_len = 5 tree nodes; builder.py adds it and num_eagle_layers 3
    assert e["max_seq_len"] == 2048 + 5 + 3 == 2056
    # raised to max_batch_size x (max_draft_len + 1)
    assert e["max_num_tokens"] == max(2048, 400 * (5 + 1)) == 2400
    # KV of 32 target layers + the EAGLE checkpoint's 1 draft layer (eagle/model.py @89fd9b74)
    assert e["kv_bytes_per_token"] == 2 * (32 + 1) * 32 * 128 * 2 == 540_672
    assert e["kv_min_bytes"] == 65 * 32 * 540_672 == 1_124_597_760
    assert e["kv_full_bytes"] == 400 * 1_124_597_760 == 449_839_104_000
    # 2400 tokens x 38400 x 2 bytes + 400 slots x (5 + 1) x 32000 x 4 bytes
    assert e["activation_bytes"] == 2400 * 38400 * 2 + 400 * 6 * 32000 * 4 == 491_520_000
    assert e["logits_cache_bytes"] == 0  # not a gather engine
    # + the EAGLE layer: one decoder layer (202,375,168 linear) + 2h norms + fc 2h x h
    eagle_params = 202_375_168 + 2 * 4096 + 2 * 4096 * 4096
    assert e["weights_bytes"] == LLAMA_7B_WEIGHTS + eagle_params * 2 == 13_948_706_816
    # the plain baseline: 32 layers only, the spec's limits
    base = engine(data, "target")
    assert (base["kv_bytes_per_token"], base["max_seq_len"], base["max_num_tokens"]) == (
        524_288,
        2048,
        2048,
    )
    server = next(s for s in data["memory"]["servers"] if s["name"] == "eg")
    fixed = PROCESS_RESERVE_BYTES + 13_948_706_816 + 491_520_000 + ENGINE_RESERVE_BYTES
    assert server["fixed_bytes"] == fixed
    assert server["need_min_bytes"] == fixed + 1_124_597_760
    assert server["need_full_bytes"] == fixed + 449_839_104_000


def test_orchestrator_mode_engine_models_name_their_gpus(models: Path, tmp_path: Path) -> None:
    """TP×PP > 1 with a draft: the repository is served in orchestrator mode
    (examples/draft_target_model/README.md: "--multi-model is necessary if TP
    mode is used"), where each engine model's gpu_device_ids places its
    spawned workers; the draft at tp 2 takes the first two of the target's 4."""
    from trtspec.plan import make_plan
    from trtspec.repo.assemble import assemble
    from trtspec.repo.configs import parameters_of, read_config
    from trtspec.spec import load_spec

    spec = load_spec(
        write(models, DRAFT_SPEC.replace("family: llama, tp: 4}", "family: llama, tp: 2}"))
    )
    repo = assemble(
        spec, make_plan(spec, models / "e"), models / "e", tmp_path / "repo", require_engines=False
    )
    ids = {
        name: parameters_of(read_config(repo / name / "config.pbtxt"))["gpu_device_ids"]
        for name in ("target", "target_dte", "draft_small_tp2pp1")
    }
    assert ids == {"target": "0,1,2,3", "target_dte": "0,1,2,3", "draft_small_tp2pp1": "0,1"}
    for name in ids:
        params = parameters_of(read_config(repo / name / "config.pbtxt"))
        assert cpp_params.problems(params, "1.1.0") == []
