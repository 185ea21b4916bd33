"""Mode ``ngram``: prompt-lookup drafting in the orchestrator (the longest
suffix n-gram found in prompt + output proposes what followed it), verified by
the shared ``target_dte`` engine. Owns the variant's spec class, its checks,
its (empty) build recipe and its orchestrator parameters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trtspec.modes.base import CheckTools, DraftScheduleName, PosInt, StepBuilder, VariantBase
from trtspec.modes.draft_model import check_loop_input, check_sweep

MODE = "ngram"


class NgramVariant(VariantBase):
    mode: Literal["ngram"] = "ngram"
    max_draft_len: int = Field(ge=1, le=1024, description="Most tokens proposed per round.")
    max_matching_ngram_size: int = Field(
        default=3, ge=1, le=64, description="Longest suffix n-gram looked up in prompt + output."
    )
    num_draft_tokens: list[PosInt] | None = Field(
        default=None,
        min_length=1,
        description="Draft lengths k swept at bench time; null = [max_draft_len].",
    )
    draft_schedule: DraftScheduleName = "constant"

    @model_validator(mode="after")
    def _derive(self) -> NgramVariant:
        if self.num_draft_tokens is None:
            self.num_draft_tokens = [self.max_draft_len]
        return self


SPEC_CLASS = NgramVariant


def check(spec: Any, v: NgramVariant, base: tuple[Any, ...], tools: CheckTools) -> None:
    check_sweep(v, base, tools)
    if v.draft_schedule == "confidence":
        tools.issues.add(
            (*base, "draft_schedule"),
            "'confidence' stops a draft by the draft model's own probability, and "
            "prompt lookup has none; use constant or adaptive (or mode: draft_model)",
        )
    check_loop_input(spec, tools)


def gpu_steps(b: StepBuilder, spec: Any, v: NgramVariant, target_src: str) -> None:
    """Nothing of its own: the n-gram drafter runs in the orchestrator and the
    shared target_dte engine is planned for every draft-loop variant."""


reference_steps = gpu_steps


def engine_parameters(v: NgramVariant) -> dict[str, object]:
    return {}


def orchestrator_parameters(v: NgramVariant) -> dict[str, object]:
    return {"max_matching_ngram_size": v.max_matching_ngram_size}
