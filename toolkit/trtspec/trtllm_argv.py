"""The exact TensorRT-LLM command lines for the engine flow of a pinned version:
which ``convert_checkpoint.py`` a family and version use, ``quantize.py`` for
quantized targets, the Medusa and EAGLE converters, and ``trtllm-build`` with
every flag that matters passed explicitly (defaults such as
``tokens_per_block`` and ``use_paged_context_fmha`` drifted between 0.17 and
1.x, so relying on them would build different engines per container).

Also what TensorRT-LLM's tools do to the values they are given, written once
for the plan, the memory plan and the spec checks: the engine limits
``trtllm-build`` actually builds (``effective_limits``) and the head split a
tensor-parallel conversion needs (``tp_split_problem``).

Pure functions returning argv lists; ``argv[0] == "python"`` means "the Python
that runs the step", mapped by the executor. Nothing here imports
``tensorrt_llm``, nor the executor's ``build`` package: the plan (pure data)
calls these, the executor runs what they return.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trtspec.catalogue import ENGINE_MODE_BY_FLAG, engine_mode
from trtspec.versions import parse_version
from trtspec.vocab import Family, Quantization

if TYPE_CHECKING:
    from trtspec.spec import Target

# Which examples/ folder converts a family (Mistral and Mixtral use Llama's converter).
FAMILY_FOLDER = {
    Family.llama: "llama",
    Family.mistral: "llama",
    Family.mixtral: "llama",
    Family.qwen2: "qwen",
}
# The Medusa converter's --model_type choices.
MEDUSA_MODEL_TYPE = {
    Family.llama: "llama",
    Family.mistral: "llama",
    Family.mixtral: "mixtral",
    Family.qwen2: "qwen2",
}
# quantize.py formats that need calibration data.
CALIBRATED = {Quantization.fp8, Quantization.int8_sq, Quantization.int4_awq}


def converter_script(examples_dir: str, version: str, family: Family) -> str:
    """``examples/<family>/`` up to 0.19, ``examples/models/core/<family>/`` from 0.20."""
    folder = FAMILY_FOLDER[family]
    ver = parse_version(version) or (1, 1, 0)
    if ver[:2] >= (0, 20):
        return f"{examples_dir}/models/core/{folder}/convert_checkpoint.py"
    return f"{examples_dir}/{folder}/convert_checkpoint.py"


def convert_argv(
    *,
    examples_dir: str,
    version: str,
    family: Family,
    source: str,
    output: str,
    dtype: str,
    tp: int,
    pp: int,
) -> list[str]:
    """Unquantized Hugging Face folder -> TRT-LLM checkpoint."""
    return [
        "python", converter_script(examples_dir, version, family),
        "--model_dir", source,
        "--output_dir", output,
        "--dtype", dtype,
        "--tp_size", str(tp),
        "--pp_size", str(pp),
    ]  # fmt: skip


def quantize_argv(
    *,
    examples_dir: str,
    source: str,
    output: str,
    dtype: str,
    quantization: Quantization,
    tp: int,
    pp: int,
    medusa: tuple[str, int, int] | None = None,
) -> list[str]:
    """Quantized checkpoint through ModelOpt's ``quantize.py`` (optionally with Medusa heads)."""
    argv = [
        "python", f"{examples_dir}/quantization/quantize.py",
        "--model_dir", source,
        "--output_dir", output,
        "--dtype", dtype,
        "--qformat", quantization.value,
        "--tp_size", str(tp),
        "--pp_size", str(pp),
    ]  # fmt: skip
    if quantization in CALIBRATED:
        argv += ["--calib_size", "512"]
    if medusa is not None:
        heads_dir, heads, draft_len = medusa
        argv += [
            "--medusa_model_dir", heads_dir,
            "--num_medusa_heads", str(heads),
            "--max_draft_len", str(draft_len),
        ]  # fmt: skip
    return argv


def medusa_convert_argv(
    *,
    examples_dir: str,
    family: Family,
    source: str,
    heads: str,
    output: str,
    dtype: str,
    num_medusa_heads: int,
    max_draft_len: int,
    tp: int,
    pp: int,
) -> list[str]:
    return [
        "python", f"{examples_dir}/medusa/convert_checkpoint.py",
        "--model_dir", source,
        "--medusa_model_dir", heads,
        "--output_dir", output,
        "--dtype", dtype,
        "--model_type", MEDUSA_MODEL_TYPE[family],
        "--num_medusa_heads", str(num_medusa_heads),
        "--max_medusa_token_len", str(max_draft_len),
        "--tp_size", str(tp),
        "--pp_size", str(pp),
    ]  # fmt: skip


def eagle_convert_argv(
    *,
    examples_dir: str,
    source: str,
    eagle: str,
    output: str,
    dtype: str,
    max_draft_len: int,
    num_eagle_layers: int,
    max_non_leaves_per_layer: int,
    tp: int,
) -> list[str]:
    return [
        "python", f"{examples_dir}/eagle/convert_checkpoint.py",
        "--model_dir", source,
        "--eagle_model_dir", eagle,
        "--output_dir", output,
        "--dtype", dtype,
        "--max_draft_len", str(max_draft_len),
        "--num_eagle_layers", str(num_eagle_layers),
        "--max_non_leaves_per_layer", str(max_non_leaves_per_layer),
        "--tp_size", str(tp),
        "--pp_size", "1",
    ]  # fmt: skip


def gemm_plugin(dtype: str, quantization: Quantization) -> str:
    # FP8 and SmoothQuant GEMMs come from TensorRT's own kernels / the SQ plugin;
    # forcing the float GEMM plugin would run them unquantized.
    if quantization in (Quantization.fp8, Quantization.int8_sq):
        return "disable"
    return dtype


def build_argv(
    *,
    checkpoint: str,
    output: str,
    target: Target,
    dtype: str,
    quantization: Quantization,
    mode: str,
    max_draft_len: int,
    gather_generation_logits: bool = False,
) -> list[str]:
    """``trtllm-build`` for one engine; ``mode`` is a --speculative_decoding_mode choice or none."""
    argv = [
        "trtllm-build",
        "--checkpoint_dir", checkpoint,
        "--output_dir", output,
        "--max_batch_size", str(target.max_batch_size),
        "--max_input_len", str(target.max_input_len),
        "--max_seq_len", str(target.max_seq_len),
        "--max_num_tokens", str(target.max_num_tokens),
        "--max_beam_width", str(target.max_beam_width),
        "--kv_cache_type", "paged",
        "--tokens_per_block", str(target.kv_cache.tokens_per_block),
        "--gpt_attention_plugin", "auto",
        "--gemm_plugin", gemm_plugin(dtype, quantization),
        "--remove_input_padding", "enable",
        "--context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--output_timing_cache", f"{output}/model.cache",
    ]  # fmt: skip
    if mode != "none":
        if mode not in ENGINE_MODE_BY_FLAG:
            raise ValueError(f"unknown speculative decoding mode {mode!r}")
        argv += ["--speculative_decoding_mode", mode, "--max_draft_len", str(max_draft_len)]
    if gather_generation_logits:
        argv.append("--gather_generation_logits")
    return argv


@dataclass(frozen=True)
class BuildLimits:
    """The limits an engine is built with, after ``trtllm-build`` adjusted the CLI's."""

    max_seq_len: int
    max_num_tokens: int


def effective_limits(
    *,
    max_seq_len: int,
    max_num_tokens: int,
    max_batch_size: int,
    mode: str,
    max_draft_len: int,
    num_eagle_layers: int = 0,
) -> BuildLimits:
    """What ``trtllm-build`` turns the CLI limits into for a ``mode`` engine
    (NVIDIA/TensorRT-LLM ``tensorrt_llm/builder.py`` ``build()`` @14e801da):
    any speculative mode adds ``max_draft_len`` to ``max_seq_len`` and EAGLE
    adds ``num_eagle_layers`` on top; ``max_num_tokens`` is raised to at least
    ``max_batch_size * (max_draft_len + 1)``. A plain engine keeps the CLI's."""
    if mode == "none":
        return BuildLimits(max_seq_len, max_num_tokens)
    seq = max_seq_len + max_draft_len
    if engine_mode(mode).name == "eagle":
        seq += num_eagle_layers
    return BuildLimits(seq, max(max_num_tokens, max_batch_size * (max_draft_len + 1)))


def tp_split_problem(heads: int, kv_heads: int, tp: int) -> str | None:
    """Why a tensor-parallel conversion of a model with ``heads`` attention and
    ``kv_heads`` KV heads over ``tp`` ranks fails, or None. The converters split
    the query heads evenly (``split`` asserts ``shape % tp_size == 0``) and
    either split the KV heads evenly or, when ``tp`` exceeds them, replicate
    each one ``tp // kv_heads`` times (``dup_kv_weight`` asserts ``tp_size %
    num_head == 0``): NVIDIA/TensorRT-LLM ``tensorrt_llm/models/convert_utils.py``
    @9b3c7124."""
    if heads % tp:
        return f"its {heads} attention heads do not split evenly over tp {tp}"
    if kv_heads >= tp and kv_heads % tp:
        return f"its {kv_heads} KV heads do not split evenly over tp {tp}"
    if kv_heads < tp and tp % kv_heads:
        return f"its {kv_heads} KV heads cannot be replicated evenly over tp {tp}"
    return None


def tokenizer_argv(source: str, output: str) -> list[str]:
    return ["python", "-m", "trtspec.build.tools", "copy-tokenizer", "--source", source,
            "--output", output]  # fmt: skip


def download_argv(repo_id: str, output: str) -> list[str]:
    return ["python", "-m", "trtspec.build.tools", "download", "--repo-id", repo_id,
            "--output", output]  # fmt: skip


def reference_argv(
    *,
    source: str,
    output: str,
    mode: str,
    max_draft_len: int,
    target: Target,
    dtype: str,
    quantization: Quantization,
    medusa: tuple[str, int, list[list[int]]] | None = None,
    eagle: tuple[str, int, list[list[int]]] | None = None,
    lookahead: tuple[int, int, int] | None = None,
) -> list[str]:
    """``python -m trtspec.build.reference`` (docs/design/engines.md) for the CPU backend."""
    ref_mode = engine_mode(mode).name  # the trtllm-build flag's trtspec spelling
    argv = [
        "python", "-m", "trtspec.build.reference",
        "--model", source,
        "--output", output,
        "--mode", ref_mode,
        "--max-draft-len", str(max_draft_len),
        "--max-batch-size", str(target.max_batch_size),
        "--max-input-len", str(target.max_input_len),
        "--max-seq-len", str(target.max_seq_len),
        "--dtype", dtype,
    ]  # fmt: skip
    if quantization is Quantization.int8:
        argv += ["--quantization", "int8"]
    if medusa is not None:
        argv += [
            "--medusa-dir",
            medusa[0],
            "--num-medusa-heads",
            str(medusa[1]),
            "--medusa-choices",
            json.dumps(medusa[2], separators=(",", ":")),
        ]
    if eagle is not None:
        argv += [
            "--eagle-dir",
            eagle[0],
            "--num-eagle-layers",
            str(eagle[1]),
            "--eagle-choices",
            json.dumps(eagle[2], separators=(",", ":")),
        ]
    if lookahead is not None:
        argv += ["--lookahead", ",".join(str(x) for x in lookahead)]
    return argv
