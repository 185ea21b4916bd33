"""Mode ``draft_model``: a separate, smaller draft model proposes; the
orchestrator's BLS loop sends its drafts to the shared ``target_dte`` engine
(``draft_tokens_external``) for verification. Owns the variant's spec class,
its checks, its draft engine's build recipe and its orchestrator parameters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trtspec.modes.base import (
    Backend,
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
        "(GPU: draft engine built with --gather_generation_logits).",
    )
    draft_schedule: DraftScheduleName = "constant"

    @model_validator(mode="after")
    def _derive(self) -> DraftModelVariant:
        if self.num_draft_tokens is None:
            self.num_draft_tokens = [self.max_draft_len]
        return self


SPEC_CLASS = DraftModelVariant


def check(spec: Any, v: DraftModelVariant, base: tuple[Any, ...], tools: CheckTools) -> None:
    check_sweep(v, base, tools)
    issues = tools.issues
    q = v.draft.quantization
    if spec.backend is Backend.reference and q not in (Quantization.none, Quantization.int8):
        issues.add(
            (*base, "draft", "quantization"),
            f"{q.value!r} needs the tensorrt_llm backend; "
            "the reference backend supports none or int8",
        )
    if spec.backend is Backend.tensorrt_llm and q is Quantization.int8:
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


def draft_dtype(spec: Any, v: DraftModelVariant) -> str:
    """The draft engine's dtype: its own, else the target's."""
    return v.draft.dtype.value if v.draft.dtype else spec.dtype


def _draft_engine(b: StepBuilder, spec: Any, v: DraftModelVariant) -> Any:
    """The variant's draft engine, or None when another variant already built it."""
    d = v.draft
    name = b.drafts[(spec.model_location(d.model).ref, d.quantization.value, draft_dtype(spec, v))]
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
    ckpt = b.plain_checkpoint(e.name, b.source(d.model), d.family, ddtype, d.quantization)
    b.gpu_engine(e, ckpt, None, d.quantization, ddtype, gather_logits=v.use_draft_logits)


def reference_steps(b: StepBuilder, spec: Any, v: DraftModelVariant, target_src: str) -> None:
    e = _draft_engine(b, spec, v)
    if e is not None:
        b.reference_engine(
            e, b.source(v.draft.model), v.draft.quantization, draft_dtype(spec, v), {}, []
        )


def engine_parameters(v: DraftModelVariant) -> dict[str, object]:
    return {}  # target_dte is auto-detected by the backend; nothing mode-specific


def orchestrator_parameters(v: DraftModelVariant) -> dict[str, object]:
    return {"use_draft_logits": v.use_draft_logits}
