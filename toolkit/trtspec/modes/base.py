"""What every mode module builds on: the spec's strict pydantic base, the
enums a variant's fields use (re-exported by ``trtspec.spec``), the variant
base class, and the duck-typed interfaces the stages hand a mode module (the
spec checker's issue list, the planner's builder). No trtspec stage is
imported here, so the spec, the planner and the repository builder can all
import the mode modules without a circle."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from trtspec.vocab import Backend, DType, Family, Quantization

__all__ = ["Backend", "DType", "Family", "Quantization"]  # re-exported for the mode modules

Path_ = tuple[Any, ...]  # a field path in the spec, e.g. ("variants", 0, "max_draft_len")


class Strict(BaseModel):
    # strict: no lax coercion (`max_input_len: true` is not 1, "12" is not 12);
    # enum fields opt out with Field(strict=False), since YAML gives their values
    # as strings and strict mode would want Enum instances.
    model_config = ConfigDict(
        extra="forbid", validate_assignment=False, use_enum_values=False, strict=True
    )


PosInt = Annotated[int, Field(ge=1)]


class VariantBase(Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        max_length=64,
        description="Unique variant name; also its Triton orchestrator model name.",
    )


DraftScheduleName = Annotated[
    Literal["constant", "adaptive", "confidence"],
    Field(
        description="Per-request draft length: constant = num_draft_tokens every round "
        "(TensorRT-LLM's BLS); adaptive = start at num_draft_tokens, +2 after a fully "
        "accepted round, -1 after a rejection (Hugging Face's heuristic schedule); "
        "confidence (draft_model only) = up to num_draft_tokens, stopping after the first "
        "token the draft gave a probability below draft_confidence_threshold (Hugging "
        "Face's default assistant schedule); never changes the output.",
    ),
]


def choices_text(choices: list[list[int]]) -> str:
    """A Medusa/EAGLE tree in the tensorrtllm backend's ``{0, 0}, {1}`` parameter format."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in choices)


class Issues(Protocol):
    """``trtspec.spec.checks``' problem list: each problem placed at a field."""

    def add(self, path: Path_, message: str, key: bool = False) -> None: ...


class CheckTools(Protocol):
    """The spec checker's helpers a mode's checks use (``trtspec.spec.checks``)."""

    issues: Issues
    warnings: list[str]
    trtllm_version: tuple[int, int, int] | None

    def location(self, value: str, path: Path_, what: str = "model") -> Any: ...

    def tree_problem(self, choices: list[list[int]]) -> str | None: ...

    def compare_vocab(self, target: Any, draft: Any, path: Path_, variant: str) -> None: ...

    def tp_split(self, model: str, tp: int, path: Path_, what: str, most: int = 64) -> None: ...


class StepBuilder(Protocol):
    """The planner's builder (``trtspec.plan._Builder``) as a mode's recipe sees it."""

    gpu: bool
    examples: str
    engines: dict[str, Any]
    drafts: dict[tuple[str, str, str, str], str]  # draft_model.draft_identity -> engine
    drafted: set[str]  # draft engines whose steps are planned

    def source(self, ref: str) -> str: ...

    def ckpt_dir(self, name: str) -> str: ...

    def checkpoint(self, name: str, kind: str, argv: list[str], inputs: list[str]) -> str: ...

    def target_checkpoint(self, src: str) -> str: ...

    def plain_checkpoint(
        self,
        name: str,
        src: str,
        family: Any,
        dtype: str,
        quant: Any,
        *,
        tp: int | None = None,
        pp: int | None = None,
    ) -> str: ...

    def gpu_engine(  # noqa: PLR0917 - mirrors plan._Builder.gpu_engine
        self,
        e: Any,
        ckpt: str,
        tokenizer_src: str | None,
        quantization: Any,
        dtype: str,
        gather_logits: bool = False,
    ) -> None: ...

    def reference_engine(  # noqa: PLR0917 - mirrors plan._Builder.reference_engine
        self,
        e: Any,
        src: str,
        quantization: Any,
        dtype: str,
        extra: dict[str, Any],
        inputs: list[str],
    ) -> None: ...
