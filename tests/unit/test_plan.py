# ruff: noqa: E501  (exact user-facing messages and argv lists read best on one line)
"""The build plan: engine sharing, exact TensorRT-LLM argv per mode and version,
reference-backend argv, cache keys, and the plan golden files."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from tests.fixtures.golden import check_golden_file
from tests.fixtures.specs import LIMITS, LOOP_LIMITS, copy_example

from trtspec.plan import make_plan
from trtspec.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "plan"


def example(tmp_path: Path, name: str):  # type: ignore[no-untyped-def]
    return load_spec(copy_example(tmp_path, name))


def spec_from(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    return load_spec(path)


def argv(plan, step_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    return next(list(s.argv) for s in plan.steps if s.id == step_id)


V = "engines/vicuna-7b"


def test_vicuna_engines_and_variants(tmp_path: Path) -> None:
    plan = make_plan(example(tmp_path, "vicuna-7b.yaml"))
    assert [
        (e.name, e.mode, e.max_draft_len, e.speculative_decoding_mode, e.variants)
        for e in plan.engines
    ] == [
        ("target", "none", 0, 1, ("baseline",)),
        ("target_dte", "draft_tokens_external", 8, 2, ("draft", "ngram")),
        ("draft_vicuna-68m", "none", 0, 1, ("draft",)),
        ("target_medusa_medusa", "medusa", 10, 4, ("medusa",)),
        ("target_eagle_eagle", "eagle", 10, 32, ("eagle",)),
        ("target_lookahead_lookahead", "lookahead_decoding", 15, 8, ("lookahead",)),
    ]
    assert {k: (v.target, v.draft) for k, v in plan.variants.items()} == {
        "baseline": ("target", None),
        "draft": ("target_dte", "draft_vicuna-68m"),
        "ngram": ("target_dte", None),
        "medusa": ("target_medusa_medusa", None),
        "eagle": ("target_eagle_eagle", None),
        "lookahead": ("target_lookahead_lookahead", None),
    }
    assert plan.engine("target").dir == Path(V) / "target"
    # One converted target checkpoint feeds target, target_dte and lookahead.
    assert [s.id for s in plan.steps if s.id.startswith("convert:")] == [
        "convert:target",
        "convert:draft_vicuna-68m",
        "convert:target_medusa_medusa",
        "convert:target_eagle_eagle",
    ]


def test_vicuna_full_argv_every_mode(tmp_path: Path) -> None:
    plan = make_plan(example(tmp_path, "vicuna-7b.yaml"))
    src = f"{V}/.sources/vicuna-7b-v1.3"
    assert argv(plan, "download:vicuna-7b-v1.3") == [
        "python",
        "-m",
        "trtspec.build.tools",
        "download",
        "--repo-id",
        "lmsys/vicuna-7b-v1.3",
        "--output",
        src,
    ]
    assert argv(plan, "convert:target") == [
        "python",
        "/app/examples/models/core/llama/convert_checkpoint.py",
        "--model_dir",
        src,
        "--output_dir",
        f"{V}/.checkpoints/target",
        "--dtype",
        "float16",
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]
    assert argv(plan, "build:target") == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{V}/.checkpoints/target",
        "--output_dir",
        f"{V}/target",
        *LIMITS,
        "--output_timing_cache",
        f"{V}/target/model.cache",
    ]
    assert argv(plan, "tokenizer:target") == [
        "python",
        "-m",
        "trtspec.build.tools",
        "copy-tokenizer",
        "--source",
        src,
        "--output",
        f"{V}/target/tokenizer",
    ]
    assert argv(plan, "build:target_dte") == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{V}/.checkpoints/target",
        "--output_dir",
        f"{V}/target_dte",
        *LOOP_LIMITS,
        "--output_timing_cache",
        f"{V}/target_dte/model.cache",
        "--speculative_decoding_mode",
        "draft_tokens_external",
        "--max_draft_len",
        "8",
    ]
    assert argv(plan, "convert:draft_vicuna-68m") == [
        "python",
        "/app/examples/models/core/llama/convert_checkpoint.py",
        "--model_dir",
        f"{V}/.sources/vicuna-68m",
        "--output_dir",
        f"{V}/.checkpoints/draft_vicuna-68m",
        "--dtype",
        "float16",
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]
    assert argv(plan, "build:draft_vicuna-68m") == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{V}/.checkpoints/draft_vicuna-68m",
        "--output_dir",
        f"{V}/draft_vicuna-68m",
        *LOOP_LIMITS,
        "--output_timing_cache",
        f"{V}/draft_vicuna-68m/model.cache",
    ]
    assert argv(plan, "convert:target_medusa_medusa") == [
        "python",
        "/app/examples/medusa/convert_checkpoint.py",
        "--model_dir",
        src,
        "--medusa_model_dir",
        f"{V}/.sources/medusa-vicuna-7b-v1.3",
        "--output_dir",
        f"{V}/.checkpoints/target_medusa_medusa",
        "--dtype",
        "float16",
        "--model_type",
        "llama",
        "--num_medusa_heads",
        "4",
        "--max_medusa_token_len",
        "10",
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]
    assert argv(plan, "build:target_medusa_medusa") == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{V}/.checkpoints/target_medusa_medusa",
        "--output_dir",
        f"{V}/target_medusa_medusa",
        *LIMITS,
        "--output_timing_cache",
        f"{V}/target_medusa_medusa/model.cache",
        "--speculative_decoding_mode",
        "medusa",
        "--max_draft_len",
        "10",
    ]
    assert argv(plan, "convert:target_eagle_eagle") == [
        "python",
        "/app/examples/eagle/convert_checkpoint.py",
        "--model_dir",
        src,
        "--eagle_model_dir",
        f"{V}/.sources/eagle-vicuna-7b-v1.3",
        "--output_dir",
        f"{V}/.checkpoints/target_eagle_eagle",
        "--dtype",
        "float16",
        "--max_draft_len",
        "10",
        "--num_eagle_layers",
        "3",
        "--max_non_leaves_per_layer",
        "10",
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]
    assert argv(plan, "build:target_eagle_eagle") == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{V}/.checkpoints/target_eagle_eagle",
        "--output_dir",
        f"{V}/target_eagle_eagle",
        *LIMITS,
        "--output_timing_cache",
        f"{V}/target_eagle_eagle/model.cache",
        "--speculative_decoding_mode",
        "eagle",
        "--max_draft_len",
        "10",
    ]
    assert argv(plan, "build:target_lookahead_lookahead") == [
        "trtllm-build",
        "--checkpoint_dir",
        f"{V}/.checkpoints/target",
        "--output_dir",
        f"{V}/target_lookahead_lookahead",
        *LIMITS,
        "--output_timing_cache",
        f"{V}/target_lookahead_lookahead/model.cache",
        "--speculative_decoding_mode",
        "lookahead_decoding",
        "--max_draft_len",
        "15",
    ]


QUANT = """\
name: q
stack: {{trtllm_version: "{version}", triton_image: "img:x"}}
target: {{model: Qwen/Qwen2.5-7B-Instruct, family: qwen2, quantization: {quant}, tp: 2,
         max_batch_size: 2, max_input_len: 100, max_seq_len: 200, max_num_tokens: 300}}
variants:
  - {{name: d, mode: draft_model, max_draft_len: 5,
     draft: {{model: Qwen/Qwen2.5-0.5B-Instruct, family: qwen2, quantization: int4_wo,
             dtype: bfloat16}}, use_draft_logits: true}}
"""


def test_quantized_target_old_layout_and_draft_logits(tmp_path: Path) -> None:
    plan = make_plan(
        spec_from(tmp_path, QUANT.format(version="0.18.0", quant="fp8")),
        Path("out"),
        examples_dir="/opt/ex",
    )
    src = "out/q/.sources/qwen2.5-7b-instruct"
    assert argv(plan, "quantize:target") == [
        "python",
        "/opt/ex/quantization/quantize.py",
        "--model_dir",
        src,
        "--output_dir",
        "out/q/.checkpoints/target",
        "--dtype",
        "float16",
        "--qformat",
        "fp8",
        "--tp_size",
        "2",
        "--pp_size",
        "1",
        "--calib_size",
        "512",
    ]
    assert argv(plan, "quantize:draft_qwen2.5-0.5b-instruct_int4_wo") == [
        "python",
        "/opt/ex/quantization/quantize.py",
        "--model_dir",
        "out/q/.sources/qwen2.5-0.5b-instruct",
        "--output_dir",
        "out/q/.checkpoints/draft_qwen2.5-0.5b-instruct_int4_wo",
        "--dtype",
        "bfloat16",
        "--qformat",
        "int4_wo",
        # the draft's own draft.tp (default 1), not the target's tp 2
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]
    limits = [
        "--max_batch_size",
        "2",
        "--max_input_len",
        "100",
        "--max_seq_len",
        "200",
        "--max_num_tokens",
        "300",
        "--max_beam_width",
        "1",
        "--kv_cache_type",
        "paged",
        "--tokens_per_block",
        "32",
        "--gpt_attention_plugin",
        "auto",
    ]
    # the draft loop's engines take max_seq_len - 1 (modes/draft_model.loop_engine_target)
    loop_limits = [*limits[:3], "199", *limits[4:]]
    fmha = [
        "--remove_input_padding",
        "enable",
        "--context_fmha",
        "enable",
        "--use_paged_context_fmha",
        "enable",
    ]
    assert argv(plan, "build:target_dte") == [
        "trtllm-build",
        "--checkpoint_dir",
        "out/q/.checkpoints/target",
        "--output_dir",
        "out/q/target_dte",
        *loop_limits,
        "--gemm_plugin",
        "disable",
        *fmha,
        "--output_timing_cache",
        "out/q/target_dte/model.cache",
        "--speculative_decoding_mode",
        "draft_tokens_external",
        "--max_draft_len",
        "5",
        # use_draft_logits: the verifying target gathers logits too
        # (examples/draft_target_model/README.md @11925f62)
        "--gather_generation_logits",
    ]
    assert argv(plan, "build:draft_qwen2.5-0.5b-instruct_int4_wo") == [
        "trtllm-build",
        "--checkpoint_dir",
        "out/q/.checkpoints/draft_qwen2.5-0.5b-instruct_int4_wo",
        "--output_dir",
        "out/q/draft_qwen2.5-0.5b-instruct_int4_wo",
        *loop_limits,
        "--gemm_plugin",
        "bfloat16",
        *fmha,
        "--output_timing_cache",
        "out/q/draft_qwen2.5-0.5b-instruct_int4_wo/model.cache",
        "--gather_generation_logits",
    ]


def test_confidence_schedule_builds_the_draft_with_its_logits(tmp_path: Path) -> None:
    """draft_schedule confidence reads the draft's probability of each token
    from its generation_logits: the draft engine gathers them; the verifying
    target (matching, no use_draft_logits) does not."""
    text = QUANT.format(version="0.18.0", quant="fp8").replace(
        "use_draft_logits: true", "draft_schedule: confidence"
    )
    plan = make_plan(spec_from(tmp_path, text), Path("out"), examples_dir="/opt/ex")
    assert argv(plan, "build:draft_qwen2.5-0.5b-instruct_int4_wo")[-1] == (
        "--gather_generation_logits"
    )
    assert "--gather_generation_logits" not in argv(plan, "build:target_dte")
    plain = QUANT.format(version="0.18.0", quant="fp8").replace(", use_draft_logits: true", "")
    plan = make_plan(spec_from(tmp_path, plain), Path("out"), examples_dir="/opt/ex")
    assert "--gather_generation_logits" not in argv(
        plan, "build:draft_qwen2.5-0.5b-instruct_int4_wo"
    )


@pytest.mark.parametrize(
    ("version", "script"),
    [
        # before 1.0 the containers keep examples/ under /app/tensorrt_llm
        ("0.17.0", "/app/tensorrt_llm/examples/qwen/convert_checkpoint.py"),
        ("0.19.0", "/app/tensorrt_llm/examples/qwen/convert_checkpoint.py"),
        ("0.20.0", "/app/tensorrt_llm/examples/models/core/qwen/convert_checkpoint.py"),
        ("1.2.1", "/app/examples/models/core/qwen/convert_checkpoint.py"),
    ],
)
def test_converter_path_per_version(tmp_path: Path, version: str, script: str) -> None:
    plan = make_plan(spec_from(tmp_path, QUANT.format(version=version, quant="none")))
    assert argv(plan, "convert:target")[1] == script


def test_reference_backend_argv(tmp_path: Path, tiny_llama: Path, tiny_draft: Path) -> None:
    heads = tmp_path / "heads"
    heads.mkdir()
    (heads / "config.json").write_text("{}")  # validate wants a checkpoint folder
    spec = spec_from(
        tmp_path,
        f"""\
        name: tiny
        backend: reference
        target: {{model: {tiny_llama}, family: llama, max_batch_size: 2, max_input_len: 64,
                 max_seq_len: 128}}
        variants:
          - {{name: draft, mode: draft_model, max_draft_len: 4,
             draft: {{model: {tiny_draft}, family: llama, quantization: int8}}}}
          - {{name: ngram, mode: ngram, max_draft_len: 6}}
          - {{name: med, mode: medusa, checkpoint: {heads}, num_medusa_heads: 2,
             medusa_choices: [[0], [0, 0], [1]]}}
          - {{name: la, mode: lookahead, window_size: 3, ngram_size: 3, verification_set_size: 2}}
        """,
    )
    plan = make_plan(spec, tmp_path / "engines")
    e = str(tmp_path / "engines" / "tiny")
    lim = [
        "--max-batch-size",
        "2",
        "--max-input-len",
        "64",
        "--max-seq-len",
        "128",
        "--dtype",
        "float32",
    ]
    loop_lim = [*lim[:3], "127", *lim[4:]]  # the draft loop's engines: max_seq_len - 1
    py = ["python", "-m", "trtspec.build.reference", "--model"]
    assert [list(s.argv) for s in plan.steps] == [
        [
            *py,
            str(tiny_llama),
            "--output",
            f"{e}/target",
            "--mode",
            "none",
            "--max-draft-len",
            "0",
            *lim,
        ],
        [
            *py,
            str(tiny_llama),
            "--output",
            f"{e}/target_dte",
            "--mode",
            "draft_tokens_external",
            "--max-draft-len",
            "6",
            *loop_lim,
        ],
        [
            *py,
            str(tiny_draft),
            "--output",
            f"{e}/draft_tiny-draft_int8",
            "--mode",
            "none",
            "--max-draft-len",
            "0",
            *loop_lim,
            "--quantization",
            "int8",
        ],
        [
            *py,
            str(tiny_llama),
            "--output",
            f"{e}/target_medusa_med",
            "--mode",
            "medusa",
            "--max-draft-len",
            "3",
            *lim,
            "--medusa-dir",
            str(heads),
            "--num-medusa-heads",
            "2",
            "--medusa-choices",
            "[[0],[0,0],[1]]",
        ],
        [
            *py,
            str(tiny_llama),
            "--output",
            f"{e}/target_lookahead_la",
            "--mode",
            "lookahead",
            "--max-draft-len",
            "9",
            *lim,
            "--lookahead",
            "3,3,2",
        ],
    ]
    assert plan.variants["draft"].draft == "draft_tiny-draft_int8"
    assert plan.units_for("ngram") == {f"{e}/target_dte"}
    assert plan.units_for("draft") == {f"{e}/target_dte", f"{e}/draft_tiny-draft_int8"}


def test_cache_keys_stable_and_sensitive(tmp_path: Path, tiny_llama: Path) -> None:
    text = f"""\
        name: tiny
        backend: reference
        target: {{model: {tiny_llama}, family: llama, max_batch_size: 2}}
        """
    a = make_plan(spec_from(tmp_path, text))
    b = make_plan(spec_from(tmp_path, text))
    assert [s.cache_key for s in a.steps] == [s.cache_key for s in b.steps]
    c = make_plan(spec_from(tmp_path, text.replace("max_batch_size: 2", "max_batch_size: 3")))
    assert a.steps[0].cache_key != c.steps[0].cache_key
    # The identity of an input folder is part of the key: touching the weights changes it.
    weights = tiny_llama / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    try:
        d = make_plan(spec_from(tmp_path, text))
        assert d.steps[0].cache_key != a.steps[0].cache_key
    finally:
        os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_distinct_drafts_built_once(tmp_path: Path) -> None:
    spec = spec_from(
        tmp_path,
        """\
        name: s
        target: {model: org/t, family: llama}
        variants:
          - {name: a, mode: draft_model, max_draft_len: 4, draft: {model: org/small, family: llama}}
          - {name: b, mode: draft_model, max_draft_len: 6, draft: {model: org/small, family: llama}}
          - {name: c, mode: draft_model, max_draft_len: 2, draft: {model: other/small, family: llama}}
        """,
    )
    plan = make_plan(spec)
    names = [e.name for e in plan.engines]
    assert names[:3] == ["target", "target_dte", "draft_small"]
    assert len(names) == 4 and names[3].startswith("draft_small_") and len(names[3]) == 18
    assert plan.engine("target_dte").max_draft_len == 6
    assert plan.variants["a"].draft == plan.variants["b"].draft == "draft_small"
    assert sum(1 for s in plan.steps if s.kind == "build") == 4


@pytest.mark.parametrize("name", ["vicuna-7b.yaml", "qwen2.5-7b.yaml"])
def test_plan_golden(tmp_path: Path, name: str) -> None:
    """Whole dry-run plans; refresh with TRTSPEC_UPDATE_GOLDEN=1 and review the diff."""
    plan = make_plan(example(tmp_path, name)).to_dict()
    plan.pop("spec_hash")  # covers absolute route paths, which differ per checkout
    golden = GOLDEN / name.replace(".yaml", ".json")
    text = json.dumps(plan, indent=2, sort_keys=True) + "\n"
    assert json.loads(check_golden_file(golden, text)) == json.loads(text)


def _shape(plan, step_id: str) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """The length flags of a trtllm-build or reference step, by flag name."""
    args = argv(plan, step_id)
    names = ("max_input_len", "max_seq_len", "max_num_tokens")
    return {
        n: int(args[args.index(flag) + 1])
        for n in names
        for flag in (f"--{n}", "--" + n.replace("_", "-"))
        if flag in args
    }


def test_the_demo_plan_builds_its_draft_loop_engines_for_prompt_plus_answer(
    tmp_path: Path,
) -> None:
    """demo-cpu.yaml as shipped (its model folder stood in, as `make demo`
    fetches it): the baseline takes prompts of max_input_len (1,536), and the
    ngram and draft_int8 variants' engines take every input their loop sends
    for an answer the baseline serves, prompt + max_tokens - 1 <= max_seq_len - 1."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "build_specs", tmp_path / "build_specs")
    model = tmp_path / ".cache" / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    spec = load_spec(tmp_path / "build_specs" / "demo-cpu.yaml")
    plan = make_plan(spec, tmp_path / "engines")
    assert spec.warnings == []
    assert _shape(plan, "reference:target") == {"max_input_len": 1536, "max_seq_len": 2048}
    loop = {"max_input_len": 2047, "max_seq_len": 2048}
    assert _shape(plan, "reference:target_dte") == loop
    draft = plan.variants["draft_int8"].draft
    assert _shape(plan, f"reference:{draft}") == loop


def test_a_small_max_num_tokens_is_raised_for_the_draft_loop_with_a_warning(
    tmp_path: Path,
) -> None:
    text = QUANT.format(version="1.1.0", quant="none").replace(
        "max_num_tokens: 300", "max_num_tokens: 150"
    )
    spec = spec_from(tmp_path, text)
    assert spec.warnings == [
        "target.max_num_tokens: 150 is below max_seq_len - 1 (199); a draft loop "
        "(draft_model, ngram) re-sends prompt + output every round, so its engines "
        "(target_dte, draft_*) are built with max_num_tokens 199, which needs more "
        "activation memory; set target.max_num_tokens to at least 199 to build every "
        "engine alike, or lower target.max_seq_len"
    ]
    plan = make_plan(spec, Path("out"))
    assert _shape(plan, "build:target") == {
        "max_input_len": 100,
        "max_seq_len": 200,
        "max_num_tokens": 150,
    }
    loop = {"max_input_len": 199, "max_seq_len": 200, "max_num_tokens": 199}
    assert _shape(plan, "build:target_dte") == loop
    assert _shape(plan, "build:draft_qwen2.5-0.5b-instruct_int4_wo") == loop
