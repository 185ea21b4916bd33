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
from trtspec.runtime.llm_args import PINNED, field_problems
from trtspec.vocab import Backend, Quantization

#: The LLM-API versions trtspec writes configs for (a field table each). Both
#: are published on PyPI (`pip index versions --pre tensorrt-llm`, 2026-12-04:
#: ... 1.3.0rc15, 1.3.0rc22, ...; no rc16-rc21); 1.3.0rc22 is the one NVIDIA
#: Dynamo's 1.4 releases pin (its 1.3 releases pin 1.3.0rc19, never published).
LlmApiVersion = Literal["1.2.1", "1.3.0rc22"]
#: Versions once pinned or paired elsewhere that no package index serves.
UNPUBLISHED_LLMAPI = {
    "1.3.0rc20": "1.3.0rc22",
    "1.3.0rc19": "1.3.0rc22",
}
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
    #: the default flow, left unnamed where a spec is summed up
    implicit: ClassVar[bool] = True
    #: variants are LLM-API configs (Triton's llmapi model, trtllm-serve, Dynamo's workers)
    llm_api: ClassVar[bool] = False

    def builds_engines(self, backend: Backend) -> bool:
        """``trtspec build`` builds engine folders (trtllm-build's, or the
        reference engines on CPU); the target's carries the tokenizer."""
        return True

    def check_spec(self, spec: Any, issues: Any, warnings: list[str]) -> None:
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


def _published_version(value: Any) -> Any:
    if isinstance(value, str) and value in UNPUBLISHED_LLMAPI:
        raise ValueError(
            f"TensorRT-LLM {value} was never published on PyPI (its index goes 1.3.0rc15 -> "
            f"1.3.0rc22); set trtllm_version: {UNPUBLISHED_LLMAPI[value]}"
        )
    return value


class LlmApiFlowSpec(Strict):
    kind: Literal["llmapi"] = Field(
        description="TensorRT-LLM's PyTorch flow: one LLM-argument YAML per variant, served "
        "by Triton's llmapi Python model (model.yaml) or `trtllm-serve --config`."
    )
    trtllm_version: Annotated[LlmApiVersion, BeforeValidator(_published_version)] = Field(
        default=DEFAULT_LLMAPI_VERSION,
        description="TensorRT-LLM version whose llm_args.py the generated files must pass: "
        "1.2.1 (the newest in an NGC Triton container, 26.04-26.07) or 1.3.0rc22 (published "
        "on PyPI; the release candidate NVIDIA Dynamo 1.4 pairs with).",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="CUDA graphs for decode batches (cuda_graph_config; false writes null).",
    )
    suffix_automaton: bool = Field(
        default=False,
        description="ngram variants draft with the suffix automaton (decoding_type SA, "
        "longest match) instead of NGram; 1.3.0rc22 only.",
    )
    llm_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further LLM arguments merged into every variant's file (one level deep "
        "for sections such as kv_cache_config; speculative_config only for speculative "
        "variants), checked against the field table of trtllm_version at spec load.",
    )
    decoupled: bool = Field(
        default=True,
        description="Triton llmapi model transaction policy; must stay true: trtspec streams "
        "every request, which upstream's model answers only in decoupled mode.",
    )
    #: the LLM API fixes the draft length per model: no per-request k to sweep
    per_request_draft_len: ClassVar[bool] = False
    implicit: ClassVar[bool] = False
    llm_api: ClassVar[bool] = True

    def builds_engines(self, backend: Backend) -> bool:
        """The CPU stand-in serves reference engines; on a GPU the LLM API
        loads the checkpoints itself and nothing is built."""
        return not backend.gpu

    def check_spec(self, spec: Any, issues: Any, warnings: list[str]) -> None:
        names = {v.name for v in spec.variants} | {BASELINE}
        for i, v in enumerate(spec.variants):
            if v.name.endswith(LLM_SUFFIX) and v.name.removesuffix(LLM_SUFFIX) in names:
                issues.add(
                    ("variants", i, "name"),
                    f"{v.name!r} clashes with the LLM model of variant "
                    f"{v.name.removesuffix(LLM_SUFFIX)!r}; pick another name",
                )
        self._check_llm_args(issues)
        if not self.decoupled:
            issues.add(
                ("flow", "decoupled"),
                "trtspec streams every request to the llmapi model, and upstream's model "
                "answers a streaming request only in decoupled mode ('Streaming is only "
                "supported in decoupled mode.'); set decoupled: true",
            )
        if spec.target.instances != 1:
            issues.add(
                ("target", "instances"),
                "the LLM-API flow serves one LLM per variant (instance_group count 1; the "
                "LLM uses every GPU it is given); set instances: 1 and scale with replicas",
            )
        gpu = spec.backend is Backend.tensorrt_llm
        if not gpu:
            ignored = stand_in_ignores(spec)
            if ignored:
                warnings.append(
                    "the CPU stand-in of the llmapi model does not imitate "
                    + ", ".join(ignored)
                    + "; they take effect on a GPU only"
                )
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
                **self.llm_args["speculative_config"],
            }
        for path, problem in field_problems(sample, self.trtllm_version):
            issues.add(
                ("flow", "llm_args", *path.split(".")),
                f"{problem} (llm_args.py of TensorRT-LLM {self.trtllm_version})",
                key="unknown field" in problem,
            )

    def _check_schedule_for(self, v: Any, issues: Any) -> None:
        """``llm_args.speculative_config.draft_len_schedule`` against this
        variant's draft length (the rules tie its smallest key to it)."""
        user = self.llm_args.get("speculative_config")
        if not isinstance(user, dict) or not user.get("draft_len_schedule"):
            return
        k = getattr(v, "num_eagle_layers", None) if v.mode == "eagle" else v.max_draft_len
        sc: dict[str, Any] = {"decoding_type": "NGram", **user, "max_draft_len": k}
        sample = {"model": "m", "speculative_config": sc}
        for path, problem in field_problems(sample, self.trtllm_version):
            if path == "speculative_config.draft_len_schedule":
                issues.add(
                    ("flow", "llm_args", "speculative_config", "draft_len_schedule"),
                    f"for variant {v.name!r} (max_draft_len {k}): {problem} "
                    f"(llm_args.py of TensorRT-LLM {self.trtllm_version})",
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
        gpu = spec.backend is Backend.tensorrt_llm
        self._check_schedule_for(v, issues)
        if v.mode == "draft_model":
            _check_dropped_draft_fields(v, base, issues, gpu)
        if v.mode == "mtp" and gpu:
            _check_mtp_target(spec, tools)
        if v.mode == "eagle" and gpu:
            _check_eagle3_checkpoint(spec, v, base, tools)
        if v.mode == "draft_model":
            tools.location(v.draft.model, (*base, "draft", "model"))
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
                "1.2.1; set flow.trtllm_version: 1.3.0rc22 or suffix_automaton: false",
            )


#: LLM arguments the CPU stand-in reads (trtspec.runtime.engine.llmapi_model); others pass it by.
STAND_IN_READS = frozenset(
    {"model", "tokenizer", "max_batch_size", "max_num_tokens", "stream_interval"}
)
#: ... and the keys of its sections it reads.
STAND_IN_READS_IN = {
    "kv_cache_config": frozenset({"enable_block_reuse"}),
    "speculative_config": frozenset(
        {
            "decoding_type",
            "max_draft_len",
            "max_matching_ngram_size",
            "max_concurrency",
            "draft_len_schedule",
            "speculative_model",
            "speculative_model_dir",
        }
    ),
}
#: draft_model fields the LLM-API flow has nowhere to write, with their
#: defaults and whether the reference build still uses them: on a GPU
#: Draft_Target loads the checkpoint as it is, with the target's parallelism
#: and dtype; no backend's llmapi model accepts by draft logits or schedules.
DROPPED_DRAFT_FIELDS = (
    (("draft", "dtype"), None, True),
    (("draft", "tp"), 1, True),
    (("draft", "pp"), 1, True),
    (("use_draft_logits",), False, False),
    (("draft_schedule",), "constant", False),
)


def stand_in_ignores(spec: Any) -> list[str]:
    """What a reference LLM-API spec sets that the CPU stand-in does not do."""
    t, out = spec.target, []
    if t.tp * t.pp > 1:
        out.append(f"tensor/pipeline parallelism (target.tp {t.tp}, pp {t.pp})")
    if t.kv_cache.free_gpu_mem_fraction != 0.9 or t.kv_cache.tokens_per_block != 32:
        out.append("target.kv_cache's fraction and block size (only enable_reuse is read)")
    skipped = []
    for key, value in spec.flow.llm_args.items():
        if key in STAND_IN_READS_IN and isinstance(value, dict):
            skipped += [f"{key}.{k}" for k in value if k not in STAND_IN_READS_IN[key]]
        elif key not in STAND_IN_READS:
            skipped.append(key)
    if skipped:
        out.append("flow.llm_args " + ", ".join(sorted(skipped)))
    if not spec.flow.cuda_graphs:
        out.append("flow.cuda_graphs (CUDA graphs exist on a GPU only)")
    return out


def _check_dropped_draft_fields(v: Any, base: tuple[Any, ...], issues: Any, gpu: bool) -> None:
    for path, default, reference_builds_it in DROPPED_DRAFT_FIELDS:
        if reference_builds_it and not gpu:
            continue  # the reference draft engine is built with it
        value: Any = v
        for part in path:
            value = getattr(value, part)
        value = getattr(value, "value", value)
        if value != default:
            issues.add(
                (*base, *path),
                f"the LLM-API flow's Draft_Target has no field for {'.'.join(path)} (the draft "
                "runs as its checkpoint is, on the target's GPUs); remove it or use `flow: "
                "engine`",
            )


def _local(spec: Any, ref: str) -> Any:
    loc = spec.model_location(ref)
    return loc.ref if loc.kind == "local" else None


def _check_mtp_target(spec: Any, tools: Any) -> None:
    from pathlib import Path

    from trtspec.spec.checkpoints import mtp_layers

    folder = _local(spec, spec.target.model)
    if folder is None:
        tools.warnings.append(
            f"target.model {spec.target.model!r} is not on this machine: trtspec cannot check "
            "that it carries MTP layers (config.json num_nextn_predict_layers), which MTP needs"
        )
        return
    layers = mtp_layers(Path(folder))
    if layers is not None and layers < 1:
        tools.issues.add(
            ("target", "model"),
            f"MTP drafts with the target's own MTP layers, and {folder}/config.json declares "
            "none (num_nextn_predict_layers; DeepSeek-V3-style checkpoints carry them): "
            "use such a target or drop the mtp variant",
        )


def _check_eagle3_checkpoint(spec: Any, v: Any, base: tuple[Any, ...], tools: Any) -> None:
    from pathlib import Path

    from trtspec.spec.checkpoints import eagle_generation

    folder = _local(spec, v.checkpoint)
    if folder is None:
        tools.warnings.append(
            f"variant {v.name!r}: checkpoint {v.checkpoint!r} is not on this machine: trtspec "
            "cannot check that it is an EAGLE-3 head (the LLM-API flow runs Eagle3)"
        )
        return
    kind, why = eagle_generation(Path(folder))
    if kind == "eagle1":
        tools.issues.add(
            (*base, "checkpoint"),
            f"{folder} is an EAGLE-1/2 checkpoint ({why}); the LLM-API flow runs it as Eagle3, "
            "whose fc takes 3 captured target states: use an EAGLE-3 checkpoint, or `flow: "
            "engine` for EAGLE-1",
        )


assert set(PINNED) == {"1.2.1", "1.3.0rc22"}  # LlmApiVersion spells PINNED's keys


def _flow_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


FlowSpec = Annotated[
    EngineFlowSpec | LlmApiFlowSpec,
    Field(discriminator="kind"),
    BeforeValidator(_flow_shorthand),
]
