"""The spec's ``flow`` field: which serving flow a spec uses, and the rules a
spec must meet under it. The spec face of ``trtspec.flows`` (whose objects
plan, write and assemble for the stages); pydantic models and checks only, no
stage imported, so ``trtspec.spec`` builds its unions and checks from them.

``flow`` is a discriminated union on ``kind``; the object pydantic makes is
the one the checks call, so no check asks "which flow is this?":

- ``engine`` (default): TensorRT-LLM's engine flow (``trtllm-build`` engines,
  Triton's ``tensorrtllm`` backend; NGC Triton <= 26.07, TensorRT-LLM <=
  1.2.x): every mode of ``trtspec.modes``, each checked by its module.
- ``llmapi``: TensorRT-LLM's PyTorch flow, one LLM-argument YAML per variant
  for Triton's ``llmapi`` model or ``trtllm-serve``: ``draft_model``,
  ``ngram``, ``eagle`` (EAGLE-3) and ``mtp``; Medusa and lookahead are
  refused (engine flow only), EAGLE-3 and MTP need a GPU.

A bare string (``flow: llmapi``) reads as ``{kind: llmapi}``.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, Field

from trtspec.catalogue import BASELINE
from trtspec.catalogue import MODES as MODE_ROWS
from trtspec.modes import MODE_MODULES, module_for
from trtspec.modes.base import PosInt, Strict, VariantBase
from trtspec.spec.llm_args import PINNED, field_problems
from trtspec.vocab import Backend, Quantization

#: The LLM-API versions trtspec writes configs for (a field table each).
LlmApiVersion = Literal["1.2.1", "1.3.0rc20"]
DEFAULT_LLMAPI_VERSION: LlmApiVersion = "1.2.1"
#: Spec modes the LLM-API flow refuses; they live in the engine flow only.
ENGINE_ONLY = {"medusa": "Medusa", "lookahead": "lookahead decoding"}
#: The last NGC Triton container that serves the engine flow, and its TensorRT-LLM.
LAST_ENGINE_FLOW_CONTAINER = (
    "NGC Triton 26.07 (nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3)"
)
LAST_ENGINE_FLOW_TRTLLM = "1.2.1"
#: Modes the reference backend cannot serve in the LLM-API flow (no reference weights path).
GPU_ONLY = {"eagle": "EAGLE-3", "mtp": "MTP"}
#: The Triton model serving an LLM-API variant's LLM: ``<variant><LLM_SUFFIX>``.
LLM_SUFFIX = "__llmapi"


class MtpVariant(VariantBase):
    """Multi-token prediction: the target checkpoint's own MTP layers draft
    (DeepSeek-V3/R1 style); LLM-API flow only."""

    mode: Literal["mtp"] = "mtp"
    max_draft_len: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Draft tokens per step (1.2.1: written as num_nextn_predict_layers; "
        "1.3: max_draft_len).",
    )
    num_draft_tokens: list[PosInt] | None = Field(
        default=None,
        min_length=1,
        description="Draft lengths swept at bench time; null = [max_draft_len].",
    )

    def model_post_init(self, __context: Any) -> None:
        if self.num_draft_tokens is None:
            self.num_draft_tokens = [self.max_draft_len]


#: Variant classes a flow adds to the spec's variant union (mode -> class).
FLOW_VARIANTS: dict[str, type[VariantBase]] = {"mtp": MtpVariant}


class EngineFlowSpec(Strict):
    kind: Literal["engine"] = Field(
        default="engine",
        description="TensorRT-LLM's engine flow: trtllm-build engines served by Triton's "
        "tensorrtllm C++ backend (NGC Triton <= 26.07, TensorRT-LLM <= 1.2.x).",
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Tokens per streamed response after the first (trtspec's orchestrators "
        "and router; the tensorrtllm backend answers every step): a request answers with its "
        "first tokens at once, then once at least this many more have arrived, and with the "
        "rest at its end, as the PyTorch flow's stream_interval LLM argument does. Fewer, "
        "fuller responses cut the Python path's cost per token at high concurrency; time to "
        "first token and the tokens are unchanged. 1 = a response per engine step.",
    )
    #: a request may set its own draft length (num_draft_tokens): the bench sweeps k
    per_request_draft_len: ClassVar[bool] = True

    def check_spec(self, spec: Any, issues: Any) -> None:
        """The engine flow's spec-wide rules live in ``trtspec.spec.checks``."""

    def check_variant(self, spec: Any, v: Any, base: tuple[Any, ...], tools: Any) -> None:
        if v.mode not in MODE_MODULES:
            tools.issues.add(
                (*base, "mode"),
                f"mode {v.mode!r} is served by the LLM-API flow only (TensorRT-LLM's PyTorch "
                "flow); set `flow: llmapi` or drop the variant",
            )
            return
        module_for(v).check(spec, v, base, tools)
        if MODE_ROWS[v.mode].greedy_only:
            where = [(("bench", "temperatures"), spec.bench.temperatures)] + [
                (("routes", name, "temperatures"), r.temperatures or [])
                for name, r in spec.routes.items()
            ]
            for path, temps in where:
                if any(temp > 0 for temp in temps):
                    tools.issues.add(
                        path,
                        f"variant {v.name!r} ({v.mode}) decodes greedily only in "
                        "TensorRT-LLM; use temperatures: [0.0] or drop the variant",
                    )


class LlmApiFlowSpec(Strict):
    kind: Literal["llmapi"] = Field(
        description="TensorRT-LLM's PyTorch flow: one LLM-argument YAML per variant, served "
        "by Triton's llmapi Python model (model.yaml) or `trtllm-serve --config`."
    )
    trtllm_version: LlmApiVersion = Field(
        default=DEFAULT_LLMAPI_VERSION,
        description="TensorRT-LLM version whose llm_args.py the generated files must pass: "
        "1.2.1 (the newest in an NGC Triton container, 26.04-26.07) or 1.3.0rc20 (the "
        "release candidate NVIDIA Dynamo pairs with).",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="CUDA graphs for decode batches (cuda_graph_config; false writes null).",
    )
    suffix_automaton: bool = Field(
        default=False,
        description="ngram variants draft with the suffix automaton (decoding_type SA, "
        "longest match) instead of NGram; 1.3.0rc20 only.",
    )
    llm_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further LLM arguments merged into every variant's file (one level deep "
        "for sections such as kv_cache_config; speculative_config only for speculative "
        "variants), checked against the field table of trtllm_version at spec load.",
    )
    decoupled: bool = Field(
        default=True,
        description="Triton llmapi model transaction policy (streaming needs decoupled).",
    )
    #: the LLM API fixes the draft length per model: no per-request k to sweep
    per_request_draft_len: ClassVar[bool] = False

    def check_spec(self, spec: Any, issues: Any) -> None:
        names = {v.name for v in spec.variants} | {BASELINE}
        for i, v in enumerate(spec.variants):
            if v.name.endswith(LLM_SUFFIX) and v.name.removesuffix(LLM_SUFFIX) in names:
                issues.add(
                    ("variants", i, "name"),
                    f"{v.name!r} clashes with the LLM model of variant "
                    f"{v.name.removesuffix(LLM_SUFFIX)!r}; pick another name",
                )
        self._check_llm_args(issues)
        gpu = spec.backend is Backend.tensorrt_llm
        if gpu and spec.target.quantization is not Quantization.none:
            issues.add(
                ("target", "quantization"),
                "the LLM API loads a checkpoint as it is; quantize it with ModelOpt, point "
                "target.model at the result and set quantization: none",
            )

    def _check_llm_args(self, issues: Any) -> None:
        """``llm_args`` against the pinned version's field table, each problem
        placed at its key in the spec (file, line, field)."""
        if not self.llm_args:
            return
        sample = {"model": "model", **self.llm_args}
        if isinstance(sample.get("speculative_config"), dict):
            # the user's keys only: each variant's decoding type comes from its mode
            sample["speculative_config"] = {
                "decoding_type": "NGram",
                "max_draft_len": 1,
                **self.llm_args["speculative_config"],
            }
        for path, problem in field_problems(sample, self.trtllm_version):
            issues.add(
                ("flow", "llm_args", *path.split(".")),
                f"{problem} (llm_args.py of TensorRT-LLM {self.trtllm_version})",
                key="unknown field" in problem,
            )

    def check_variant(self, spec: Any, v: Any, base: tuple[Any, ...], tools: Any) -> None:
        issues = tools.issues
        if v.mode in ENGINE_ONLY:
            issues.add(
                (*base, "mode"),
                f"{ENGINE_ONLY[v.mode]} exists only in TensorRT-LLM's engine flow (trtllm-build "
                "+ Triton's tensorrtllm backend), not in the LLM-API (PyTorch) flow; use `flow: "
                f"engine` (last container serving it: {LAST_ENGINE_FLOW_CONTAINER}, "
                f"TensorRT-LLM {LAST_ENGINE_FLOW_TRTLLM}) or drop the variant",
            )
            return
        if spec.backend is Backend.reference and v.mode in GPU_ONLY:
            issues.add(
                (*base, "mode"),
                f"{GPU_ONLY[v.mode]} needs a GPU: the reference backend has no "
                f"{GPU_ONLY[v.mode]} weights path in the LLM-API flow; set backend: "
                "tensorrt_llm or drop the variant",
            )
            return
        if v.mode == "draft_model":
            tools.location(v.draft.model, (*base, "draft", "model"))
            gpu = spec.backend is Backend.tensorrt_llm
            if gpu and v.draft.quantization is not Quantization.none:
                issues.add(
                    (*base, "draft", "quantization"),
                    "the LLM API loads a checkpoint as it is; quantize the draft with ModelOpt, "
                    "point draft.model at the result and set quantization: none",
                )
        if v.mode == "eagle":
            tools.location(v.checkpoint, (*base, "checkpoint"), "EAGLE")
            tools.warnings.append(
                f"variant {v.name!r}: the LLM-API flow runs EAGLE-3 as a linear chain of "
                f"num_eagle_layers ({v.num_eagle_layers}) tokens; eagle_choices is not used"
            )
        if v.mode == "ngram" and self.suffix_automaton and self.trtllm_version == "1.2.1":
            issues.add(
                ("flow", "suffix_automaton"),
                "the suffix-automaton drafter (decoding_type SA) arrived after TensorRT-LLM "
                "1.2.1; set flow.trtllm_version: 1.3.0rc20 or suffix_automaton: false",
            )


assert set(PINNED) == {"1.2.1", "1.3.0rc20"}  # LlmApiVersion spells PINNED's keys


def _flow_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


FlowSpec = Annotated[
    EngineFlowSpec | LlmApiFlowSpec,
    Field(discriminator="kind"),
    BeforeValidator(_flow_shorthand),
]
