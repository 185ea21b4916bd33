"""Mode ``medusa``: extra decoding heads on the target propose a token tree
inside one engine (``target_medusa_<variant>``); greedy only in TensorRT-LLM.
Owns the variant's spec class, its checks and derived ``max_draft_len``, its
build recipe per backend and its engine's Triton parameters."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from trtspec import trtllm_argv
from trtspec.catalogue import MODES
from trtspec.modes.base import (
    CheckTools,
    Family,
    Quantization,
    StepBuilder,
    VariantBase,
    choices_text,
)

MODE = "medusa"


class MedusaVariant(VariantBase):
    mode: Literal["medusa"] = "medusa"
    checkpoint: str = Field(
        min_length=1, description="Medusa heads checkpoint (local folder or hub id)."
    )
    num_medusa_heads: int = Field(default=4, ge=1, le=64, description="Number of Medusa heads.")
    medusa_choices: list[list[Annotated[int, Field(ge=0)]]] = Field(
        min_length=1, description="Medusa tree: paths of top-k indices, one level per head."
    )
    max_draft_len: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="null = len(medusa_choices); a value must be >= that.",
    )
    # what the spec said (None = derive); the checks compare it with the tree
    _given_max_draft_len: int | None = None

    @model_validator(mode="after")
    def _derive(self) -> MedusaVariant:
        self._given_max_draft_len = self.max_draft_len
        self.max_draft_len = self.max_draft_len or len(self.medusa_choices)
        return self


SPEC_CLASS = MedusaVariant


def check(spec: Any, v: MedusaVariant, base: tuple[Any, ...], tools: CheckTools) -> None:
    issues = tools.issues
    tools.location(v.checkpoint, (*base, "checkpoint"), "Medusa")
    t = spec.target
    if (
        spec.backend.gpu
        and t.family is Family.qwen2
        and t.quantization is Quantization.none
        and t.tp > 1
    ):
        # examples/medusa/convert_checkpoint.py (NVIDIA/TensorRT-LLM @b93e14ca)
        # loads Qwen2 with QWenForCausalLM.from_hugging_face(model_dir, dtype),
        # no Mapping, and saves those full weights as every rank{N}.safetensors:
        # wrong shards at TP > 1, silently. quantize.py builds a mapping per rank.
        issues.add(
            ("target", "tp"),
            f"Medusa variant {v.name!r} on a qwen2 target cannot be converted at tp "
            f"{t.tp}: TensorRT-LLM's Medusa converter writes the unsplit Qwen2 weights "
            "for every rank; set tp: 1, or a target.quantization (quantize.py shards "
            "by --tp_size), or drop the variant",
        )
    problem = tools.tree_problem(v.medusa_choices)
    if problem:
        issues.add((*base, "medusa_choices"), problem)
    deep = max(len(c) for c in v.medusa_choices)
    if deep > v.num_medusa_heads:
        issues.add(
            (*base, "medusa_choices"),
            f"a path is {deep} deep but there are only "
            f"{v.num_medusa_heads} heads; shorten it or raise num_medusa_heads",
        )
    n, given = len(v.medusa_choices), v._given_max_draft_len
    if given is not None and given < n:
        issues.add(
            (*base, "max_draft_len"),
            f"{given} is smaller than the {n} medusa_choices "
            f"nodes; remove it (derived = {n}) or set it to at least {n}",
        )


def gpu_steps(b: StepBuilder, spec: Any, v: MedusaVariant, target_src: str) -> None:
    """Target + heads through the Medusa converter (quantize.py if quantized), then trtllm-build."""
    t = spec.target
    q, dtype = t.quantization, spec.dtype
    e = b.engines[MODES[MODE].engine_name(v.name)]
    heads = b.source(v.checkpoint)
    mdl = int(v.max_draft_len or 0)
    out = b.ckpt_dir(e.name)
    if q is Quantization.none:
        argv = trtllm_argv.medusa_convert_argv(
            examples_dir=b.examples,
            family=t.family,
            source=target_src,
            heads=heads,
            output=out,
            dtype=dtype,
            num_medusa_heads=v.num_medusa_heads,
            max_draft_len=mdl,
            tp=t.tp,
            pp=t.pp,
        )
        ckpt = b.checkpoint(e.name, "convert", argv, [target_src, heads])
    else:
        argv = trtllm_argv.quantize_argv(
            examples_dir=b.examples,
            source=target_src,
            output=out,
            dtype=dtype,
            quantization=q,
            tp=t.tp,
            pp=t.pp,
            medusa=(heads, v.num_medusa_heads, mdl),
        )
        ckpt = b.checkpoint(e.name, "quantize", argv, [target_src, heads])
    b.gpu_engine(e, ckpt, target_src, q, dtype)


def reference_steps(b: StepBuilder, spec: Any, v: MedusaVariant, target_src: str) -> None:
    e = b.engines[MODES[MODE].engine_name(v.name)]
    heads = b.source(v.checkpoint)
    extra = {"medusa": (heads, v.num_medusa_heads, v.medusa_choices)}
    b.reference_engine(e, target_src, spec.target.quantization, spec.dtype, extra, [heads])


def engine_parameters(v: MedusaVariant) -> dict[str, object]:
    return {"medusa_choices": choices_text(v.medusa_choices)}


def orchestrator_parameters(v: MedusaVariant) -> dict[str, object]:
    return {}
