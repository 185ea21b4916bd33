"""The tensor contract of every engine model, per pinned TensorRT-LLM version:
the subset of the official ``tensorrt_llm/config.pbtxt`` inputs and outputs
that trtspec sends and reads, with their dtype, dims, reshape and optionality.
The ``tensorrtllm`` C++ backend and the reference Python engine get the same
lists, which is what lets the orchestrator treat both alike. Names drift by
version (``random_seed``/``min_length`` before 0.20, ``seed``/``min_tokens``
from 0.20; the KV-reuse outputs exist from 0.17, asked for with
``return_kv_cache_reuse_stats`` before 0.19; lookahead inputs,
``return_perf_metrics`` and the timing/acceptance outputs exist from 0.19);
``tests/data/tensorrtllm_template_names_*.txt`` holds the official names these
lists are checked against. The logits tensors (``draft_logits`` in,
``generation_logits`` out, ``return_generation_logits``) carry the draft
logits of ``use_draft_logits`` variants from the draft engine to the target.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.catalogue import LOOKAHEAD_INPUTS
from trtspec.versions import MAX_TRTLLM_EXCLUSIVE, MIN_TRTLLM

# The template's ``${logits_datatype}`` for the logits tensors. It must be the
# engines' logits dtype, which is ``float32`` unless trtllm-build gets
# ``--logits_dtype`` (trtspec never passes it): TensorRT-LLM
# ``tensorrt_llm/models/modeling_utils.py`` ``PretrainedConfig(...,
# logits_dtype: str = 'float32')``; NVIDIA's draft-target guide fills
# ``logits_datatype:TYPE_FP32``.
LOGITS_DATATYPE = "TYPE_FP32"


@dataclass(frozen=True)
class TensorSpec:
    """One input or output of a model config. ``dims`` excludes the batch dim."""

    name: str
    data_type: str  # a ``DataType`` enum name, e.g. "TYPE_INT32"
    dims: tuple[int, ...]
    scalar: bool = False  # dims [1] with ``reshape: { shape: [] }``
    optional: bool = False
    ragged: bool = False


@dataclass(frozen=True)
class EngineContract:
    """The engine model's tensors for one TensorRT-LLM version."""

    version: str
    seed_input: str
    min_tokens_input: str
    perf_metrics: bool  # return_perf_metrics + timing/acceptance outputs exist
    # the input that asks for the kv_cache_* outputs: return_kv_cache_reuse_stats
    # (0.17, 0.18), then return_perf_metrics (0.19 on)
    reuse_stats_input: str
    lookahead_inputs: bool
    # tokenizer_dir / xgrammar_tokenizer_info_path / guided_decoding_backend:
    # read outside any try from 0.19 (a missing key fails the model load),
    # absent from the template and never read before.
    guided_decoding_params: bool
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]


def parse_version(text: str) -> tuple[int, int]:
    """``"1.1.0"`` → ``(1, 1)``; raises ``ValueError`` on anything else."""
    parts = str(text).strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise ValueError(f"not a TensorRT-LLM version: {text!r}")
    return int(parts[0]), int(parts[1])


def _scalar(name: str, dtype: str, optional: bool = True) -> TensorSpec:
    return TensorSpec(name, dtype, (1,), scalar=True, optional=optional)


def _output(name: str, dtype: str, dims: tuple[int, ...] = (1,)) -> TensorSpec:
    return TensorSpec(name, dtype, dims)


#: The KV-reuse outputs: in the template from 0.17 (triton-inference-server/
#: tensorrtllm_backend tags v0.17.0 and v0.18.0 all_models/inflight_batcher_llm/
#: tensorrt_llm/config.pbtxt, with input ``return_kv_cache_reuse_stats``).
KV_REUSE_OUTPUTS = (
    "kv_cache_alloc_new_blocks",
    "kv_cache_reused_blocks",
    "kv_cache_alloc_total_blocks",
)
KV_REUSE_INPUT_BEFORE_019 = "return_kv_cache_reuse_stats"

#: Every perf output from 0.19 (tag v0.19.0: ``return_perf_metrics`` asks for
#: the KV-reuse, timing and acceptance outputs together).
PERF_OUTPUTS = (
    *KV_REUSE_OUTPUTS,
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)

_PERF_DTYPES = {
    "acceptance_rate": "TYPE_FP32",
    "arrival_time_ns": "TYPE_INT64",
    "first_scheduled_time_ns": "TYPE_INT64",
    "first_token_time_ns": "TYPE_INT64",
    "last_token_time_ns": "TYPE_INT64",
}


def engine_contract(trtllm_version: str) -> EngineContract:
    """The engine tensors for ``trtllm_version`` (``"0.17"`` … ``"1.2.x"``)."""
    major_minor = parse_version(trtllm_version)
    if not MIN_TRTLLM <= major_minor < MAX_TRTLLM_EXCLUSIVE:
        low, high = (".".join(map(str, v)) for v in (MIN_TRTLLM, MAX_TRTLLM_EXCLUSIVE))
        raise ValueError(
            f"TensorRT-LLM {trtllm_version} is outside the supported range {low} <= v < {high}"
        )
    renamed = major_minor >= (0, 20)
    since_019 = major_minor >= (0, 19)
    seed = "seed" if renamed else "random_seed"
    min_tokens = "min_tokens" if renamed else "min_length"

    inputs: list[TensorSpec] = [
        # optional in every supported template (tags v0.17.0 … v0.19.0 declare
        # it ``optional: true``: requests may carry input embeddings instead)
        TensorSpec("input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
        _scalar("input_lengths", "TYPE_INT32", optional=False),
        _scalar("request_output_len", "TYPE_INT32", optional=False),
        TensorSpec("draft_input_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
        TensorSpec("draft_logits", LOGITS_DATATYPE, (-1, -1), optional=True, ragged=True),
        _scalar("end_id", "TYPE_INT32"),
        _scalar("pad_id", "TYPE_INT32"),
        _scalar("beam_width", "TYPE_INT32"),
        _scalar("temperature", "TYPE_FP32"),
        _scalar("runtime_top_k", "TYPE_INT32"),
        _scalar("runtime_top_p", "TYPE_FP32"),
        _scalar(min_tokens, "TYPE_INT32"),
        _scalar(seed, "TYPE_UINT64"),
        _scalar("return_log_probs", "TYPE_BOOL"),
        _scalar("return_generation_logits", "TYPE_BOOL"),
        _scalar("exclude_input_in_output", "TYPE_BOOL"),
        _scalar("streaming", "TYPE_BOOL"),
        _scalar("stop", "TYPE_BOOL"),
    ]
    reuse_input = "return_perf_metrics" if since_019 else KV_REUSE_INPUT_BEFORE_019
    inputs.insert(-3, _scalar(reuse_input, "TYPE_BOOL"))
    if since_019:
        # The template declares these three without reshape and ragged.
        inputs.extend(
            TensorSpec(name, "TYPE_INT32", (1,), optional=True, ragged=True)
            for name in LOOKAHEAD_INPUTS
        )
    outputs: list[TensorSpec] = [
        _output("output_ids", "TYPE_INT32", (-1, -1)),
        _output("sequence_length", "TYPE_INT32", (-1,)),
        _output("cum_log_probs", "TYPE_FP32", (-1,)),
        _output("output_log_probs", "TYPE_FP32", (-1, -1)),
        _output("generation_logits", LOGITS_DATATYPE, (-1, -1, -1)),
    ]
    perf_outputs = PERF_OUTPUTS if since_019 else KV_REUSE_OUTPUTS
    outputs.extend(_output(n, _PERF_DTYPES.get(n, "TYPE_INT32")) for n in perf_outputs)
    return EngineContract(
        version=trtllm_version,
        seed_input=seed,
        min_tokens_input=min_tokens,
        perf_metrics=since_019,
        reuse_stats_input=reuse_input,
        lookahead_inputs=since_019,
        guided_decoding_params=since_019,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
    )


# The public orchestrator / router contract (docs/design/orchestrator.md): python,
# decoupled, max_batch_size 0, so dims are the full shape.
ORCHESTRATOR_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_input", "TYPE_STRING", (1,)),
    TensorSpec("max_tokens", "TYPE_INT32", (1,)),
    TensorSpec("temperature", "TYPE_FP32", (1,), optional=True),
    TensorSpec("top_k", "TYPE_INT32", (1,), optional=True),
    TensorSpec("top_p", "TYPE_FP32", (1,), optional=True),
    TensorSpec("seed", "TYPE_UINT64", (1,), optional=True),
    TensorSpec("stream", "TYPE_BOOL", (1,), optional=True),
    TensorSpec("num_draft_tokens", "TYPE_INT32", (1,), optional=True),
    TensorSpec("route", "TYPE_STRING", (1,), optional=True),
    TensorSpec("request_id", "TYPE_STRING", (1,), optional=True),
)

#: The LLM-API flow's per-variant model: its ``acceptance`` parameter when the
#: pinned TensorRT-LLM fills the llmapi model's acceptance outputs.
LLMAPI_ACCEPTANCE_AVAILABLE = "available"
#: The CPU stand-in llmapi model's parameter naming the pinned TensorRT-LLM (its
#: draft_len_schedule rule follows the version; upstream's model reads none).
LLMAPI_VERSION_PARAMETER = "trtspec_trtllm_version"
#: ... and whether that version's model sends its acceptance outputs as zeros
#: ("zeroed", before upstream PR #17082) or filled ("filled").
LLMAPI_ACCEPTANCE_OUTPUTS_PARAMETER = "trtspec_acceptance_outputs"

# prefix_reused_tokens: prompt tokens the target engine served from its KV
# cache at the request's first call (kv_cache_reused_blocks × tokens per block).
STAT_OUTPUTS = (
    "prompt_tokens",
    "completion_tokens",
    "draft_tokens",
    "accepted_tokens",
    "rounds",
    "prefix_reused_tokens",
)

ORCHESTRATOR_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "TYPE_STRING", (1,)),
    TensorSpec("output_ids", "TYPE_INT32", (-1,)),
    TensorSpec("is_final", "TYPE_BOOL", (1,)),
    *(TensorSpec(name, "TYPE_INT32", (1,)) for name in STAT_OUTPUTS),
    # rows [drafted, accepted] per draft position 1..k over the request's
    # rounds (speculate.position_counts); shape (2, 0) where the runtime
    # reports no rounds (modes that draft inside the engine)
    TensorSpec("position_acceptance", "TYPE_INT32", (2, -1)),
    TensorSpec("server_ttft_ns", "TYPE_INT64", (1,)),
    TensorSpec("server_total_ns", "TYPE_INT64", (1,)),
    TensorSpec("variant", "TYPE_STRING", (1,)),
    TensorSpec("fallback", "TYPE_BOOL", (1,)),
    # Only in an orchestrator's final response to the router after it had
    # streamed: the failure's message. On 2.51 an error response after
    # streamed ones never reaches a BLS caller (runtime/models/orchestrator.py);
    # the router answers its client with this error, never with the tensor.
    TensorSpec("error", "TYPE_STRING", (1,)),
)

# preprocessing / postprocessing keep the upstream tensor names (max_batch_size 0).
PREPROCESSING_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("QUERY", "TYPE_STRING", (1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
)
PREPROCESSING_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("INPUT_ID", "TYPE_INT32", (-1,)),
    TensorSpec("REQUEST_INPUT_LEN", "TYPE_INT32", (1,)),
    TensorSpec("REQUEST_OUTPUT_LEN", "TYPE_INT32", (1,)),
    TensorSpec("OUT_END_ID", "TYPE_INT32", (1,)),
    TensorSpec("OUT_PAD_ID", "TYPE_INT32", (1,)),
)
POSTPROCESSING_INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("TOKENS_BATCH", "TYPE_INT32", (-1, -1)),
    TensorSpec("SEQUENCE_LENGTH", "TYPE_INT32", (-1,)),
)
POSTPROCESSING_OUTPUTS: tuple[TensorSpec, ...] = (TensorSpec("OUTPUT", "TYPE_STRING", (-1,)),)
