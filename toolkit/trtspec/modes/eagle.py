"""Mode ``eagle``: an EAGLE-1 draft layer on the target's hidden states
proposes a static token tree inside one engine (``target_eagle_<variant>``);
greedy only in TensorRT-LLM. Owns the variant's spec class, its checks and
derived ``max_draft_len``, its build recipe per backend and its engine's
Triton parameters."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from trtspec import trtllm_argv
from trtspec.catalogue import MODES
from trtspec.modes.base import (
    CheckTools,
    Quantization,
    StepBuilder,
    VariantBase,
    choices_text,
)

MODE = "eagle"
#: Target families TensorRT-LLM's EAGLE converter reads (examples/eagle/convert_checkpoint.py).
EAGLE_FAMILIES = {"llama"}
#: TensorRT-LLM's EAGLE limits: draft tree nodes and batch size.
MAX_EAGLE_DRAFT_LEN = 256
MAX_EAGLE_BATCH = 512


class EagleVariant(VariantBase):
    mode: Literal["eagle"] = "eagle"
    checkpoint: str = Field(min_length=1, description="EAGLE checkpoint (local folder or hub id).")
    num_eagle_layers: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Draft iterations; must equal the deepest eagle_choices path.",
    )
    max_non_leaves_per_layer: int = Field(
        default=10, ge=1, le=256, description="Most non-leaf nodes per tree level."
    )
    eagle_choices: list[list[Annotated[int, Field(ge=0)]]] = Field(
        min_length=1, description="EAGLE-1 static tree: paths of top-k indices."
    )
    max_draft_len: int | None = Field(
        default=None, ge=1, le=1024, description="null = len(eagle_choices); at most 256."
    )

    @model_validator(mode="after")
    def _derive(self) -> EagleVariant:
        if self.max_draft_len is None:
            self.max_draft_len = len(self.eagle_choices)
        return self


SPEC_CLASS = EagleVariant


def check(spec: Any, v: EagleVariant, base: tuple[Any, ...], tools: CheckTools) -> None:
    issues = tools.issues
    t = spec.target
    tools.location(v.checkpoint, (*base, "checkpoint"), "EAGLE")
    if t.family.value not in EAGLE_FAMILIES:
        issues.add(
            (*base, "mode"),
            f"EAGLE needs a Llama-family target (TensorRT-LLM's EAGLE converter "
            f"reads Llama configs only), but target.family is {t.family.value!r}; drop the variant "
            "or use a Llama target",
        )
    if t.pp != 1:
        issues.add(
            ("target", "pp"),
            f"EAGLE variant {v.name!r} needs pp: 1 (the EAGLE converter "
            "supports tensor parallelism only)",
        )
    if t.max_batch_size > MAX_EAGLE_BATCH:
        issues.add(
            ("target", "max_batch_size"),
            f"{t.max_batch_size} exceeds EAGLE's limit of {MAX_EAGLE_BATCH} "
            f"(variant {v.name!r}); set max_batch_size <= {MAX_EAGLE_BATCH}",
        )
    if spec.backend.gpu and t.quantization is not Quantization.none:
        issues.add(
            ("target", "quantization"),
            f"EAGLE variant {v.name!r} is converted unquantized by "
            "examples/eagle/convert_checkpoint.py; set quantization: none or drop the variant",
        )
    problem = tools.tree_problem(v.eagle_choices)
    if problem:
        issues.add((*base, "eagle_choices"), problem)
    # examples/eagle/README.md (Known issues): "All EAGLE choices have to have
    # exactly the same depth as num_eagle_layers of the engine"; NVIDIA's own
    # trees mix path lengths, so it is the deepest path that must match.
    deep = max(len(c) for c in v.eagle_choices)
    if deep != v.num_eagle_layers:
        fix = (
            "shorten the deepest path"
            if deep > v.num_eagle_layers
            else (f"add a path {v.num_eagle_layers} deep")
        )
        issues.add(
            (*base, "eagle_choices"),
            f"the tree is {deep} deep but num_eagle_layers is {v.num_eagle_layers}; "
            "TensorRT-LLM needs the deepest path exactly num_eagle_layers long: "
            f"set num_eagle_layers: {deep} or {fix}",
        )
    non_leaves: dict[int, int] = {}
    prefixes = {tuple(c[:-1]) for c in v.eagle_choices if len(c) > 1}
    for p in prefixes:
        non_leaves[len(p)] = non_leaves.get(len(p), 0) + 1
    worst = max(non_leaves.values(), default=0)
    if worst > v.max_non_leaves_per_layer:
        issues.add(
            (*base, "eagle_choices"),
            f"a level has {worst} non-leaf nodes, more than "
            f"max_non_leaves_per_layer {v.max_non_leaves_per_layer}; raise it or prune the tree",
        )
    n, mdl = len(v.eagle_choices), int(v.max_draft_len or 0)
    if mdl > MAX_EAGLE_DRAFT_LEN:
        issues.add(
            (*base, "max_draft_len"),
            f"{mdl} exceeds EAGLE's limit of {MAX_EAGLE_DRAFT_LEN}; use a smaller tree",
        )
    elif mdl < n:
        issues.add(
            (*base, "max_draft_len"),
            f"{mdl} is smaller than the {n} eagle_choices nodes; "
            f"remove it (derived = {n}) or set it to at least {n}",
        )


def gpu_steps(b: StepBuilder, spec: Any, v: EagleVariant, target_src: str) -> None:
    """Target + EAGLE layer through the EAGLE converter, then trtllm-build."""
    t = spec.target
    e = b.engines[MODES[MODE].engine_name(v.name)]
    eagle = b.source(v.checkpoint)
    argv = trtllm_argv.eagle_convert_argv(
        examples_dir=b.examples,
        source=target_src,
        eagle=eagle,
        output=b.ckpt_dir(e.name),
        dtype=spec.dtype,
        max_draft_len=int(v.max_draft_len or 0),
        num_eagle_layers=v.num_eagle_layers,
        max_non_leaves_per_layer=v.max_non_leaves_per_layer,
        tp=t.tp,
    )
    ckpt = b.checkpoint(e.name, "convert", argv, [target_src, eagle])
    b.gpu_engine(e, ckpt, target_src, t.quantization, spec.dtype)


def reference_steps(b: StepBuilder, spec: Any, v: EagleVariant, target_src: str) -> None:
    e = b.engines[MODES[MODE].engine_name(v.name)]
    eagle = b.source(v.checkpoint)
    extra = {"eagle": (eagle, v.num_eagle_layers, v.eagle_choices)}
    b.reference_engine(e, target_src, spec.target.quantization, spec.dtype, extra, [eagle])


def engine_parameters(v: EagleVariant) -> dict[str, object]:
    return {"eagle_choices": choices_text(v.eagle_choices)}


def orchestrator_parameters(v: EagleVariant) -> dict[str, object]:
    return {}
