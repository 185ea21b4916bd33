"""Mode ``draft_model``: a separate, smaller draft model proposes; the
orchestrator's BLS loop sends its drafts to the shared ``target_dte`` engine
(``draft_tokens_external``) for verification. Owns the variant's spec class,
its checks, its draft engine's build recipe and its orchestrator parameters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trtspec.modes.base import (
    CheckTools,
    DraftScheduleName,
    DType,
    Family,
    PosInt,
    Quantization,
    StepBuilder,
    Strict,
    VariantBase,
)
from trtspec.runtime.speculate import DEFAULT_CONFIDENCE_THRESHOLD

MODE = "draft_model"


class DraftModel(Strict):
    model: str = Field(
        min_length=1, description="Draft model: local HF folder, .gguf file, or hub id."
    )
    family: Family = Field(strict=False, description="Draft model family.")
    dtype: DType | None = Field(
        default=None, strict=False, description="Draft dtype; null = the target's."
    )
    quantization: Quantization = Field(
        default=Quantization.none, strict=False, description="Draft quantization."
    )
    tp: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Draft tensor parallel size (its own, not the target's; at most the "
        "target's TP×PP GPUs, which the draft shares).",
    )
    pp: int = Field(default=1, ge=1, le=64, description="Draft pipeline parallel size.")

    @property
    def world(self) -> int:
        return self.tp * self.pp


class DraftModelVariant(VariantBase):
    mode: Literal["draft_model"] = "draft_model"
    draft: DraftModel = Field(
        description="The draft model, built once per distinct model + quantization."
    )
    max_draft_len: int = Field(
        ge=1,
        le=1024,
        description="Most draft tokens per round; the shared target_dte engine uses the largest.",
    )
    num_draft_tokens: list[PosInt] | None = Field(
        default=None,
        min_length=1,
        description="Draft lengths k swept at bench time; null = [max_draft_len].",
    )
    use_draft_logits: bool = Field(
        default=False,
        description="Accept by the draft's logits: speculative sampling, min(1, p/q) "
        "(GPU: draft and target_dte engines built with --gather_generation_logits).",
    )
    draft_schedule: DraftScheduleName = "constant"
    draft_confidence_threshold: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="With draft_schedule: confidence, the draft probability below which a "
        "round's draft stops (that token is still drafted); null = 0.4, Hugging Face's "
        "assistant_confidence_threshold default.",
    )

    @model_validator(mode="after")
    def _derive(self) -> DraftModelVariant:
        if self.num_draft_tokens is None:
            self.num_draft_tokens = [self.max_draft_len]
        return self


SPEC_CLASS = DraftModelVariant


def check(spec: Any, v: DraftModelVariant, base: tuple[Any, ...], tools: CheckTools) -> None:
    check_sweep(v, base, tools)
    check_loop_input(spec, tools)
    issues = tools.issues
    if v.draft_confidence_threshold is not None and v.draft_schedule != "confidence":
        issues.add(
            (*base, "draft_confidence_threshold"),
            f"is read only by draft_schedule: confidence (this variant's is "
            f"{v.draft_schedule!r}); set draft_schedule: confidence or remove it",
        )
    q = v.draft.quantization
    if not spec.backend.gpu and q not in (Quantization.none, Quantization.int8):
        issues.add(
            (*base, "draft", "quantization"),
            f"{q.value!r} needs the tensorrt_llm backend; "
            "the reference backend supports none or int8",
        )
    d, t = v.draft, spec.target
    if not spec.backend.gpu and d.world != 1:
        issues.add(
            (*base, "draft", "tp"), "the reference backend runs one process; set tp: 1 and pp: 1"
        )
    elif d.world > t.tp * t.pp:
        # The draft's ranks are placed on its instance's target GPUs (plan.placement).
        issues.add(
            (*base, "draft", "tp"),
            f"the draft's tp×pp = {d.world} is more than the target's {t.tp * t.pp} GPUs; "
            f"give the draft at most {t.tp * t.pp} (a draft is the smaller model)",
        )
    tools.tp_split(v.draft.model, d.tp, (*base, "draft", "tp"), "the draft", t.tp * t.pp)
    if spec.backend.gpu and q is Quantization.int8:
        issues.add(
            (*base, "draft", "quantization"),
            "'int8' is the reference backend's dynamic int8; "
            "on tensorrt_llm use int8_wo or int8_sq",
        )
    loc = tools.location(v.draft.model, (*base, "draft", "model"))
    tloc = spec.model_location(spec.target.model)
    if loc.kind == "local" and tloc.kind == "local":
        tools.compare_vocab(tloc.ref, loc.ref, (*base, "draft", "model"), v.name)


def check_sweep(v: Any, base: tuple[Any, ...], tools: CheckTools) -> None:
    """Every swept k fits the variant's max_draft_len (both draft-loop modes)."""
    over = [k for k in v.num_draft_tokens or [v.max_draft_len] if k > v.max_draft_len]
    if over:
        tools.issues.add(
            (*base, "max_draft_len"),
            f"{v.max_draft_len} is smaller than num_draft_tokens "
            f"{over}; set max_draft_len to at least {max(over)}",
        )


def loop_input_len(target: Any) -> int:
    """The longest input a draft loop sends an engine. Every round re-sends
    prompt + output so far (trtspec's orchestrator and the upstream BLS
    ``_spec_generate`` alike), so the last round's input is at most
    prompt + max_tokens - 1, and the baseline serves up to prompt + max_tokens
    = max_seq_len: max_seq_len - 1, the bound TensorRT-LLM's runtime itself
    derives for long inputs (``TrtGptModelInflightBatching``: "maxInputLen =
    maxSequenceLen - 1" with chunked context, "min(maxSequenceLen - 1,
    maxNumTokens)" with context FMHA and packed input, which is how
    trtspec builds; NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/
    trtGptModelInflightBatching.cpp, 1.x)."""
    return int(target.max_seq_len) - 1


def loop_engine_target(target: Any) -> Any:
    """``target`` as the draft loop's engines (``target_dte`` and every draft
    engine) are built: ``max_input_len`` raised to :func:`loop_input_len`, and
    ``max_num_tokens`` with it, since with context FMHA and packed input the
    runtime caps an input at ``max_num_tokens`` too (above). An input longer
    than ``max_input_len`` is refused (LlmRequest::validate, "Prompt length (%d)
    exceeds maximum input length (%d)"), and prompt + draft tokens over it cut
    the draft (NVIDIA/TensorRT-LLM cpp/tensorrt_llm/batch_manager/llmRequest.cpp,
    1.x). The baseline's prompt limit stays ``target.max_input_len``: the
    orchestrator enforces it (its ``max_prompt_len`` parameter)."""
    need = loop_input_len(target)
    if target.max_input_len >= need and target.max_num_tokens >= need:
        return target
    return target.model_copy(
        update={
            "max_input_len": max(int(target.max_input_len), need),
            "max_num_tokens": max(int(target.max_num_tokens), need),
        }
    )


def loop_parameters(spec: Any) -> dict[str, object]:
    """A draft-loop orchestrator's length parameters (runtime/models/orchestrator.py):
    the prompt length and prompt + max_tokens the baseline's engine serves,
    and the input length the loop's engines are built with. The baseline's
    TensorRT-LLM engine takes prompts up to min(max_seq_len - 1,
    max_num_tokens) (trtspec builds with context FMHA and packed input, and
    the Triton config turns chunked context off; the runtime rule quoted in
    :func:`loop_input_len`) and clamps an output past max_seq_len
    (LlmRequest::validate, "Number of requested output tokens is changed");
    the reference engine refuses both past max_input_len / max_seq_len."""
    t = spec.target
    gpu = spec.backend.gpu
    return {
        "max_prompt_len": min(loop_input_len(t), int(t.max_num_tokens))
        if gpu
        else int(t.max_input_len),
        "max_seq_len": int(t.max_seq_len),
        "max_input_len": loop_input_len(t),
        "clamp_max_tokens": gpu,
    }


def check_loop_input(spec: Any, tools: CheckTools) -> None:
    """Say where the draft loop's engines differ from the spec's target in a
    way that costs something: on tensorrt_llm a ``max_num_tokens`` below the
    loop's input length is raised for those engines (more activation memory).
    Once per spec, whichever draft-loop variant comes first."""
    t = spec.target
    need = loop_input_len(t)
    if not spec.backend.gpu or t.max_num_tokens >= need:
        return
    message = (
        f"target.max_num_tokens: {t.max_num_tokens} is below max_seq_len - 1 ({need}); "
        f"a draft loop (draft_model, ngram) re-sends prompt + output every round, so its "
        f"engines (target_dte, draft_*) are built with max_num_tokens {need}, which needs "
        f"more activation memory; set target.max_num_tokens to at least {need} to build "
        "every engine alike, or lower target.max_seq_len"
    )
    if message not in tools.warnings:
        tools.warnings.append(message)


def draft_dtype(spec: Any, v: DraftModelVariant) -> str:
    """The draft engine's dtype: its own, else the target's."""
    return v.draft.dtype.value if v.draft.dtype else spec.dtype


def draft_identity(spec: Any, v: DraftModelVariant) -> tuple[str, str, str, str]:
    """What makes two variants' draft engines the same engine."""
    d = v.draft
    return (
        spec.model_location(d.model).ref,
        d.quantization.value,
        draft_dtype(spec, v),
        f"tp{d.tp}pp{d.pp}",
    )


def _draft_engine(b: StepBuilder, spec: Any, v: DraftModelVariant) -> Any:
    """The variant's draft engine, or None when another variant already built it."""
    name = b.drafts[draft_identity(spec, v)]
    if name in b.drafted:
        return None
    b.drafted.add(name)
    return b.engines[name]


def gpu_steps(b: StepBuilder, spec: Any, v: DraftModelVariant, target_src: str) -> None:
    """convert/quantize + trtllm-build of the draft engine (target_dte is shared)."""
    e = _draft_engine(b, spec, v)
    if e is None:
        return
    d, ddtype = v.draft, draft_dtype(spec, v)
    # The draft is converted with its own TP/PP: small drafts often have head
    # counts the target's TP does not divide (the checks refuse those), and
    # examples/draft_target_model/README.md (TensorRT-LLM @11925f62, 0.18.0)
    # sizes the draft's device list by "the TP size of the draft model engine".
    ckpt = b.plain_checkpoint(
        e.name, b.source(d.model), d.family, ddtype, d.quantization, tp=d.tp, pp=d.pp
    )
    b.gpu_engine(e, ckpt, None, d.quantization, ddtype, gather_logits=e.gather_logits)


def reference_steps(b: StepBuilder, spec: Any, v: DraftModelVariant, target_src: str) -> None:
    e = _draft_engine(b, spec, v)
    if e is not None:
        b.reference_engine(
            e, b.source(v.draft.model), v.draft.quantization, draft_dtype(spec, v), {}, []
        )


def engine_parameters(v: DraftModelVariant) -> dict[str, object]:
    return {}  # target_dte is auto-detected by the backend; nothing mode-specific


def confidence_threshold(v: DraftModelVariant) -> float | None:
    """The variant's draft confidence threshold, None unless its schedule is confidence."""
    if v.draft_schedule != "confidence":
        return None
    if v.draft_confidence_threshold is not None:
        return v.draft_confidence_threshold
    return DEFAULT_CONFIDENCE_THRESHOLD


def needs_draft_logits(v: DraftModelVariant) -> bool:
    """Whether the draft engine returns generation logits: for acceptance by
    logits, and for the confidence schedule (the draft's probability of its
    token). On a GPU that takes ``--gather_generation_logits`` at build."""
    return v.use_draft_logits or v.draft_schedule == "confidence"


def orchestrator_parameters(v: DraftModelVariant) -> dict[str, object]:
    params: dict[str, object] = {"use_draft_logits": v.use_draft_logits}
    threshold = confidence_threshold(v)
    if threshold is not None:
        params["draft_confidence_threshold"] = threshold
    return params
