"""The spec's pydantic schema: enums for every choice, ranges on every number,
unknown keys forbidden, one class per section (each variant mode's class lives
in its ``trtspec.modes`` module; the union of them comes from that registry),
plus the small pure helpers the schema needs (model locations). Field
descriptions feed the spec reference page (``trtspec.docgen``, docs/reference/spec.md)."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from trtspec.catalogue import BASELINE, DEFAULT_CANARY_PERCENT, DEFAULT_STEPS, DRAFT_LOOP_ENGINE
from trtspec.modes import MODE_MODULES
from trtspec.modes.base import Backend, DType, Family, Quantization
from trtspec.modes.base import Strict as _Strict
from trtspec.modes.draft_model import DraftModelVariant
from trtspec.modes.eagle import EagleVariant
from trtspec.modes.lookahead import LookaheadVariant
from trtspec.modes.medusa import MedusaVariant
from trtspec.modes.ngram import NgramVariant
from trtspec.runtime import limits
from trtspec.spec.flows import FLOW_VARIANTS, EngineFlowSpec, FlowSpec, MtpVariant
from trtspec.versions import EXAMPLES_DIR_FROM_1_0, default_examples_dir, image_for

DEFAULT_TRTLLM_VERSION = "1.1.0"
DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"  # = image_for(1.1.0)
DEFAULT_EXAMPLES_DIR = EXAMPLES_DIR_FROM_1_0  # the default version's; older ones differ

RESERVED_NAMES = {
    BASELINE,
    "preprocessing",
    "postprocessing",
    "router",
    "target",
    DRAFT_LOOP_ENGINE,
}
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _request_limit(problem: Any) -> AfterValidator:
    """A request value's legal range from ``trtspec.runtime.limits`` (one definition
    for the spec, the bench CLI and the served models)."""

    def check(value: Any) -> Any:
        found = problem(value)
        if found is not None:
            raise PydanticCustomError("request_limit", found)
        return value

    return AfterValidator(check)


def _bench_temperature_problem(value: float) -> str | None:
    found = limits.temperature_problem(value)
    if found is None and value > limits.BENCH_TEMPERATURE_MAX:
        found = f"must be at most {limits.BENCH_TEMPERATURE_MAX} in a benchmark"
    return found


BenchTemperature = Annotated[float, _request_limit(_bench_temperature_problem)]


class Stack(_Strict):
    trtllm_version: str = Field(
        default=DEFAULT_TRTLLM_VERSION,
        description="TensorRT-LLM version of the build container; 0.17 <= v < 1.3.",
    )
    triton_image: str | None = Field(
        default=None,
        description="Triton TRT-LLM container image the engines are built and served in; "
        "null = the first container of the version table that ships trtllm_version "
        "(1.1.0: 25.12, 1.2.1: 26.04).",
    )
    examples_dir: str | None = Field(
        default=None,
        min_length=1,
        description="Where TensorRT-LLM's examples/ live in the container "
        "(convert_checkpoint.py, quantize.py); null = /app/tensorrt_llm/examples "
        "before 1.0, /app/examples from 1.0.",
    )

    @model_validator(mode="after")
    def _image_from_version(self) -> Stack:
        # Left None when no container ships the version; the checks say so.
        if self.triton_image is None:
            self.triton_image = image_for(self.trtllm_version)
        if self.examples_dir is None:
            self.examples_dir = default_examples_dir(self.trtllm_version)
        return self


class KvCache(_Strict):
    tokens_per_block: int = Field(
        default=32,
        ge=8,
        le=256,
        description="Paged KV block size in tokens (a power of two); passed explicitly "
        "since the default drifted (64 in 0.17, 32 in 1.x).",
    )
    free_gpu_mem_fraction: float = Field(
        default=0.9,
        gt=0.0,
        le=1.0,
        description="Fraction of free GPU memory the KV cache may take "
        "(Triton kv_cache_free_gpu_mem_fraction).",
    )
    enable_reuse: bool = Field(
        default=True,
        description="KV-cache block reuse across requests (Triton enable_kv_cache_reuse).",
    )


class Target(_Strict):
    model: str = Field(
        min_length=1,
        description="Local HF folder, .gguf file, or hub id (org/name); relative paths "
        "resolve against the spec's folder.",
    )
    family: Family = Field(
        strict=False, description="Model family; picks the convert_checkpoint.py folder."
    )
    dtype: DType | None = Field(
        default=None,
        strict=False,
        description="Compute dtype; null = float16 on tensorrt_llm, float32 on reference.",
    )
    quantization: Quantization = Field(
        default=Quantization.none,
        strict=False,
        description="none | fp8 | int8_sq | int4_awq | int8_wo | int4_wo (GPU, via "
        "quantize.py) | int8 (reference only).",
    )
    tp: int = Field(
        default=1, ge=1, le=64, description="Tensor parallel size (fixed at checkpoint conversion)."
    )
    pp: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Pipeline parallel size (fixed at checkpoint conversion).",
    )
    max_batch_size: int = Field(
        default=8, ge=1, le=4096, description="trtllm-build --max_batch_size."
    )
    max_input_len: int = Field(
        default=2048, ge=1, le=1_048_576, description="trtllm-build --max_input_len."
    )
    max_seq_len: int = Field(
        default=4096,
        ge=2,
        le=1_048_576,
        description="trtllm-build --max_seq_len (prompt + output).",
    )
    max_num_tokens: int = Field(
        default=8192, ge=1, le=1_048_576, description="trtllm-build --max_num_tokens."
    )
    max_beam_width: int = Field(
        default=1,
        ge=1,
        le=64,
        description="trtllm-build --max_beam_width; must be 1 with any speculative variant.",
    )
    instances: int = Field(
        default=1, ge=1, le=64, description="Triton instance count of the engine models."
    )
    kv_cache: KvCache = Field(default_factory=KvCache, description="KV-cache settings.")


_VARIANT_CLASSES = (
    *(m.SPEC_CLASS for m in MODE_MODULES.values()),
    *FLOW_VARIANTS.values(),  # modes only a flow other than the engine flow serves (mtp)
)
if TYPE_CHECKING:  # the type checker's view; pydantic's union comes from the registry
    Variant = Annotated[
        DraftModelVariant
        | NgramVariant
        | MedusaVariant
        | EagleVariant
        | LookaheadVariant
        | MtpVariant,
        Field(discriminator="mode"),
    ]
else:
    Variant = Annotated[Union[_VARIANT_CLASSES], Field(discriminator="mode")]  # noqa: UP007 - a runtime tuple
#: Spec mode name -> its variant class (trtspec.modes owns each).
MODES = {name: m.SPEC_CLASS for name, m in MODE_MODULES.items()}


class Route(_Strict):
    prompts: str = Field(
        min_length=1, description="Prompt set (.jsonl), relative to the spec's folder."
    )
    max_tokens: int = Field(
        default=128, ge=1, le=65536, description="Completion length per request."
    )
    checks: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]] = Field(
        default_factory=list,
        description="Quality checks (python_compile, ruff, pytest, json_schema, golden, ...).",
    )
    requests: int | None = Field(
        default=None,
        ge=1,
        description="Requests for this route; null = bench.requests_per_route. Sampling "
        "until decided, the most pairs per cell when below --max-requests.",
    )
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] | None = Field(
        default=None,
        min_length=1,
        description="Closed-loop concurrency levels for this route (e.g. a sweep on one "
        "route); null = bench.concurrency. `trtspec bench --concurrency` overrides both.",
    )
    temperatures: list[BenchTemperature] | None = Field(
        default=None,
        min_length=1,
        description="Sampling temperatures for this route (e.g. [0.0, 0.7]: the service's "
        "own beside T=0), each in [0, 2]; null = bench.temperatures. `trtspec bench "
        "--temperatures` overrides both.",
    )


class Objectives(_Strict):
    """Latency objectives a request must meet to count towards goodput."""

    ttft_ms: float | None = Field(
        default=None, gt=0.0, description="Time to first token at most this (ms)."
    )
    itl_ms: float | None = Field(
        default=None,
        gt=0.0,
        description="Inter-token latency (the request's TPOT) at most this (ms).",
    )
    latency_ms: float | None = Field(
        default=None, gt=0.0, description="End-to-end latency at most this (ms)."
    )


class Decision(_Strict):
    min_speedup: float = Field(
        default=1.05,
        gt=0.0,
        le=100.0,
        description="Promote only when the speedup CI's lower bound exceeds this.",
    )
    max_p95_regression: float = Field(
        default=0.10,
        ge=0.0,
        le=10.0,
        description="Largest allowed p95 latency regression (fraction).",
    )
    min_quality_pass_rate: float = Field(
        default=0.95, ge=0.0, le=1.0, description="Least quality-check pass rate."
    )
    min_equal_rate: float = Field(
        default=1.0,
        ge=0.0,
        le=1.0,
        description="Least rate of baseline-equal outputs at temperature 0.",
    )
    max_error_rate: float = Field(
        default=0.01, ge=0.0, le=1.0, description="Largest allowed request error rate."
    )
    min_pairs: int = Field(
        default=5,
        ge=2,
        le=100000,
        description="Fewest paired prompts a decision needs; fewer ends inconclusive.",
    )
    objectives: Objectives | None = Field(
        default=None,
        description="Per-request latency objectives; the bench reports goodput (the share "
        "of requests meeting them and their tokens/s) per arm and load.",
    )
    decide_by: Literal["speedup", "goodput"] = Field(
        default="speedup",
        description="The speed criterion of a decision: the paired speedup, or the paired "
        "difference in the share of requests meeting `objectives` (needs objectives).",
    )


#: The decision thresholds' defaults, for summaries of runs whose settings lack some.
DEFAULT_DECISION: dict[str, Any] = Decision().model_dump()

ExternalName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=64)]


class ExternalArm(_Strict):
    openai: str = Field(
        description="Base URL of an OpenAI-compatible server (vLLM, trtllm-serve, SGLang), "
        "e.g. http://127.0.0.1:8000; a trailing /v1 is accepted.",
    )
    model: str = Field(
        min_length=1, description="Served model name sent as `model` (one GET /v1/models lists)."
    )
    baseline: str | None = Field(
        default=None,
        description="The external arm this one is compared with (its server's target-only "
        "twin); null = this arm is a baseline.",
    )
    metrics: str | None = Field(
        default=None,
        description="Prometheus page with the spec-decode counters; null = <openai>/metrics "
        "(trtllm-serve: <openai>/prometheus/metrics).",
    )
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the server's API key (sent as a bearer "
        "token); the key itself never goes in the spec.",
    )


class Bench(_Strict):
    concurrency: list[Annotated[int, Field(ge=1, le=4096)]] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="Closed-loop levels: requests of one arm in flight (the unit of "
        "routing.yaml's max_concurrency).",
    )
    temperatures: list[BenchTemperature] = Field(
        default_factory=lambda: [0.0],
        min_length=1,
        description="Sampling temperatures, each in [0, 2].",
    )
    top_p: Annotated[float, _request_limit(limits.top_p_problem)] = Field(
        default=1.0, description="Nucleus sampling p, in (0, 1]."
    )
    top_k: Annotated[int, _request_limit(limits.top_k_problem)] = Field(
        default=0, description="Top-k (0 = off)."
    )
    seed: Annotated[int, _request_limit(limits.seed_problem)] = Field(
        default=1234,
        description="Base sampling seed (unsigned 64-bit; request i uses seed + i, wrapping).",
    )
    warmup_requests: int = Field(
        default=2, ge=0, description="Requests per variant excluded from stats."
    )
    requests_per_route: int = Field(default=30, ge=1, description="Default requests per route.")
    request_rate: float | None = Field(
        default=None, gt=0.0, description="Open-loop Poisson rate (req/s); null = closed loop."
    )
    decision: Decision = Field(default_factory=Decision, description="Decision thresholds.")
    external: dict[ExternalName, ExternalArm] = Field(
        default_factory=dict,
        description="Arm name -> an OpenAI-compatible server benchmarked on the same routes "
        "beside the Triton arms.",
    )


class RolloutLog(_Strict):
    destination: Literal["file", "stdout", "off"] = Field(
        default="file",
        description="Per-request log: `file` (rotating requests.jsonl in the router's "
        "rollout folder), `stdout` (a container's log collector) or `off`.",
    )
    max_bytes: int = Field(
        default=10 * 1024 * 1024,
        ge=4096,
        description="Size at which the log file is rotated (requests.jsonl.1, .2, ...).",
    )
    backups: int = Field(default=3, ge=0, le=100, description="Rotated files kept.")
    queue: int = Field(
        default=10000,
        ge=1,
        description="Lines waiting for the writer thread; beyond it lines are dropped "
        "and counted, never waited for.",
    )
    prompts: bool = Field(
        default=False, description="Also log each request's prompt text (off: never logged)."
    )


class Rollout(_Strict):
    canary_percent: int = Field(
        default=DEFAULT_CANARY_PERCENT,
        ge=0,
        le=100,
        description="Share of a promoted route's traffic its variant starts with (the canary).",
    )
    steps: list[Annotated[int, Field(ge=1, le=100)]] = Field(
        default_factory=lambda: list(DEFAULT_STEPS),
        min_length=1,
        description="The ramp `trtspec rollout advance` walks, in percent, ending at 100.",
    )
    fallback_variant: str = Field(
        default=BASELINE, description="Variant used when the speculative path fails."
    )
    window_requests: int = Field(
        default=200,
        ge=2,
        description="Most recent requests per route and arm a live comparison looks at.",
    )
    min_requests: int = Field(
        default=20,
        ge=2,
        description="Fewest requests on each arm (canary, control) before a window is judged.",
    )
    golden_every: int = Field(
        default=50,
        ge=0,
        description="Mirror one golden prompt through variant and fallback at temperature 0 "
        "every this many requests of a route on a canary; 0 = never.",
    )
    golden_prompts: int = Field(
        default=4,
        ge=1,
        description="Golden set size per route: its prompts with a `golden` answer first.",
    )
    golden_max_tokens: int = Field(
        default=32, ge=1, le=4096, description="Tokens generated per golden comparison."
    )
    auto_rollback: bool = Field(
        default=True,
        description="Send a route back to its fallback on a golden mismatch, or an error "
        "rate or p95 latency breach over the window.",
    )
    log: RolloutLog = Field(default_factory=RolloutLog, description="Per-request log.")

    @field_validator("steps")
    @classmethod
    def _ramp(cls, steps: list[int]) -> list[int]:
        if any(b <= a for a, b in itertools.pairwise(steps)) or steps[-1] != 100:
            raise PydanticCustomError(
                "rollout_steps",
                "must rise strictly and end at 100, e.g. [5, 25, 50, 100]",
            )
        return steps


class Router(_Strict):
    instances: int = Field(
        default=1,
        ge=1,
        le=32,
        description="Router processes (the router model's Triton instance_group count). "
        "Every streamed token of every request passes through one of them, and one Python "
        "process relays a few thousand tokens a second (benchmarks/ceiling.py prints that "
        "ceiling): where cores are free (a GPU host serving more), more instances raise it; "
        "measure with ceiling.py --router-instances. They share the routes' max_concurrency "
        "and draft-length schedules, the request log and the metrics (label `router_instance`); "
        "each judges its own share of a canary's live window. On a two-core CPU they only "
        "add contention: keep 1.",
    )


class Spec(_Strict):
    name: str = Field(
        pattern=r"^[a-z0-9][a-z0-9._-]*$",
        max_length=100,
        description="Spec name: engines/<name>/, triton_repo/<name>/.",
    )
    stack: Stack = Field(
        default_factory=Stack, description="Pinned TensorRT-LLM / Triton versions."
    )
    backend: Backend = Field(
        default=Backend.tensorrt_llm,
        strict=False,
        description="tensorrt_llm (GPU engines) or reference (CPU torch engines).",
    )
    flow: FlowSpec = Field(
        default_factory=EngineFlowSpec,
        description="Serving flow: engine (default; trtllm-build engines, Triton tensorrtllm "
        "backend) or llmapi (TensorRT-LLM's PyTorch flow: one LLM-argument YAML per variant); "
        "`flow: llmapi` is short for {kind: llmapi}. See trtspec.flows.",
    )
    target: Target = Field(description="The target model and its engine limits.")
    variants: list[Variant] = Field(
        default_factory=list,
        description="Speculative variants; the target-only `baseline` is implicit.",
    )
    routes: dict[str, Route] = Field(
        default_factory=dict, description="Route name -> prompt set and settings."
    )
    bench: Bench = Field(default_factory=Bench, description="Benchmark settings.")
    rollout: Rollout = Field(
        default_factory=Rollout, description="Router defaults before a benchmark decides."
    )
    router: Router = Field(default_factory=Router, description="How the router model is served.")

    _source_path: Path | None = PrivateAttr(None)
    _warnings: list[str] = PrivateAttr(default_factory=list)

    @property
    def source_path(self) -> Path | None:
        return self._source_path

    @property
    def warnings(self) -> list[str]:
        return self._warnings

    @property
    def base_dir(self) -> Path:
        return self._source_path.parent if self._source_path else Path.cwd()

    def resolve_path(self, value: str | Path) -> Path:
        """A spec path made absolute against the spec file's folder."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else (self.base_dir / path).resolve()

    def model_location(self, value: str) -> ModelLocation:
        return locate(value, self.base_dir)

    def tokenizer_dir(self, engines_root: Path) -> Path:
        """The target's tokenizer folder (chat templates, token counts, the
        router's golden set): the one ``trtspec build`` copies into the target
        engine (``<engines>/<spec>/target/tokenizer``), or, where the flow
        builds no engines (the LLM API on a GPU), the target checkpoint's
        folder."""
        if self.flow.builds_engines(self.backend):
            return Path(engines_root) / self.name / "target" / "tokenizer"
        return Path(self.model_location(self.target.model).ref)

    @property
    def dtype(self) -> str:
        if self.target.dtype is not None:
            return self.target.dtype.value
        return "float32" if self.backend is Backend.reference else "float16"

    def variant(self, name: str) -> Any:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    def canonical(self) -> dict[str, Any]:
        """The resolved spec as plain data: paths absolute, derived values filled."""
        data = self.model_dump(mode="json")
        if data["flow"] == {"kind": "engine"}:
            del data["flow"]  # the default flow: engine specs hash as before the field
        data["target"]["model"] = self.model_location(self.target.model).ref
        for v in data["variants"]:
            if v["mode"] == "draft_model":
                v["draft"]["model"] = self.model_location(v["draft"]["model"]).ref
            if v["mode"] in ("medusa", "eagle"):
                v["checkpoint"] = self.model_location(v["checkpoint"]).ref
        for route in data["routes"].values():
            route["prompts"] = str(self.resolve_path(route["prompts"]))
        return data

    @property
    def spec_hash(self) -> str:
        blob = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


class ModelLocation(BaseModel):
    """Where a model reference points: a local folder, a .gguf file, or a hub id."""

    kind: Literal["local", "gguf", "hub", "missing"]
    ref: str  # absolute path for local/gguf/missing, "org/name" for hub


def locate(value: str, base: Path) -> ModelLocation:
    path = Path(value).expanduser()
    full = path if path.is_absolute() else (base / path)
    if full.exists():
        if full.is_file() and full.suffix == ".gguf":
            return ModelLocation(kind="gguf", ref=str(full.resolve()))
        return ModelLocation(kind="local", ref=str(full.resolve()))
    looks_local = value.startswith(("/", "./", "../", "~")) or value.endswith(".gguf")
    if not looks_local and HUB_ID.match(value):
        return ModelLocation(kind="hub", ref=value)
    return ModelLocation(kind="missing", ref=str(full.resolve()))
