"""Mode ``lookahead``: Jacobi lookahead decoding inside one engine
(``target_lookahead_<variant>``): the target itself guesses n-grams in a
window of W, keeps a pool, and verifies up to G of them per step. Owns the
variant's spec class, its checks and derived ``max_draft_len`` (the
catalogue's formula), its build recipe per backend and its engine's Triton
parameters."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from trtspec.catalogue import LOOKAHEAD_INPUTS, MODES, lookahead_max_draft_len, lookahead_problem
from trtspec.modes.base import CheckTools, StepBuilder, VariantBase

MODE = "lookahead"
#: The tensorrtllm backend reads lookahead_window_size & co. from v0.19.0.
MIN_TRTLLM_LOOKAHEAD = (0, 19)


class LookaheadVariant(VariantBase):
    mode: Literal["lookahead"] = "lookahead"
    window_size: int = Field(default=4, ge=1, le=64, description="W: lookahead window.")
    ngram_size: int = Field(default=3, ge=1, le=64, description="N: n-gram size.")
    verification_set_size: int = Field(
        default=4, ge=0, le=64, description="G: verification set size."
    )
    max_draft_len: int | None = Field(
        default=None,
        ge=0,
        le=4096,
        description="null = (N==1 ? 0 : N-2) + (W-1+G)*(N-1); any other value is rejected.",
    )
    # what the spec said (None = derive); the checks compare it with (W, N, G)
    _given_max_draft_len: int | None = None

    @property
    def wng(self) -> tuple[int, int, int]:
        return self.window_size, self.ngram_size, self.verification_set_size

    @model_validator(mode="after")
    def _derive(self) -> LookaheadVariant:
        self._given_max_draft_len = self.max_draft_len
        self.max_draft_len = lookahead_max_draft_len(*self.wng)
        return self


SPEC_CLASS = LookaheadVariant


def check(spec: Any, v: LookaheadVariant, base: tuple[Any, ...], tools: CheckTools) -> None:
    issues = tools.issues
    ver = tools.trtllm_version
    if spec.backend.gpu and ver and ver[:2] < MIN_TRTLLM_LOOKAHEAD:
        issues.add(
            (*base, "mode"),
            f"lookahead needs TensorRT-LLM 0.19 or later (the Triton backend of "
            f"{spec.stack.trtllm_version} cannot configure it); raise "
            "stack.trtllm_version or drop the variant",
        )
    (w, n, g), derived, given = v.wng, int(v.max_draft_len or 0), v._given_max_draft_len
    if lookahead_problem(w, n, g) is not None:  # the field bounds leave only N == 1
        issues.add(
            (*base, "ngram_size"),
            "ngram_size 1 requires window_size 1 and "
            "verification_set_size 0; raise ngram_size or set W=1, G=0",
        )
    elif derived == 0:
        issues.add(
            (*base, "ngram_size"),
            "(W=1, N=1, G=0) drafts nothing (max_draft_len 0); use ngram_size >= 2",
        )
    elif given is not None and given != derived:
        issues.add(
            (*base, "max_draft_len"),
            f"{given} conflicts with (W={w}, N={n}, G={g}), "
            f"which needs exactly {derived}; remove max_draft_len or set it to {derived}",
        )


def gpu_steps(b: StepBuilder, spec: Any, v: LookaheadVariant, target_src: str) -> None:
    """The plain target checkpoint, built with --speculative_decoding_mode lookahead_decoding."""
    e = b.engines[MODES[MODE].engine_name(v.name)]
    q = spec.target.quantization
    b.gpu_engine(e, b.target_checkpoint(target_src), target_src, q, spec.dtype)


def reference_steps(b: StepBuilder, spec: Any, v: LookaheadVariant, target_src: str) -> None:
    e = b.engines[MODES[MODE].engine_name(v.name)]
    b.reference_engine(
        e, target_src, spec.target.quantization, spec.dtype, {"lookahead": v.wng}, []
    )


def engine_parameters(v: LookaheadVariant) -> dict[str, object]:
    return {name: int(x) for name, x in zip(LOOKAHEAD_INPUTS, v.wng, strict=True)}


def orchestrator_parameters(v: LookaheadVariant) -> dict[str, object]:
    return {}
