"""Assembling one Triton model repository per spec: ``assemble(spec, plan,
engines_root, output, routing=None)`` writes ``output/<spec>/`` with
``preprocessing``, ``postprocessing``, one engine model per engine of the plan
(``tensorrtllm`` C++ backend or the reference Python engine, same tensors),
one orchestrator per variant plus ``baseline``, the ``router`` with its
routing table, and the ``trtspec-repo.json`` manifest (docs/design/repository.md).
Every config is a ``ModelConfig`` message; the tree is built in a temporary
folder and swapped in by rename only once complete, so an interrupted run
never leaves a half repository that ``trtspec serve`` would trust.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts.repo_manifest import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION, ROUTING_FILE
from trtspec.artifacts.rollout_state import CONFIG_FILE
from trtspec.artifacts.routing import RoutingTable, routing_from_rollout
from trtspec.catalogue import BASELINE, DRAFT_LOOP_MODES, ENGINE_MODES, engine_mode
from trtspec.errors import RepoError
from trtspec.fsutil import make_staging_dir
from trtspec.modes import module_for
from trtspec.modes.draft_model import loop_parameters
from trtspec.repo import configs
from trtspec.repo.rollout_config import rollout_config
from trtspec.runtime.contract import (
    ORCHESTRATOR_INPUTS,
    ORCHESTRATOR_OUTPUTS,
    POSTPROCESSING_INPUTS,
    POSTPROCESSING_OUTPUTS,
    PREPROCESSING_INPUTS,
    PREPROCESSING_OUTPUTS,
    engine_contract,
)
from trtspec.vocab import gpu_backend

if TYPE_CHECKING:
    from trtspec.memory import MemoryPlan
    from trtspec.plan import Plan
    from trtspec.spec import Spec

PREPROCESSING = "preprocessing"
POSTPROCESSING = "postprocessing"
ROUTER = "router"
TRITON_BACKEND = {"tensorrt_llm": "tensorrtllm", "reference": "python"}
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
# Where the backend reads these three (EngineContract.guided_decoding_params) it
# does so outside any try (getGuidedDecodingConfigFromParams): an absent key
# fails the model load; an empty value means guided decoding off.
GUIDED_DECODING_OFF = {
    "tokenizer_dir": "",
    "xgrammar_tokenizer_info_path": "",
    "guided_decoding_backend": "",
}

MODEL_SOURCES = {
    PREPROCESSING: "trtspec.runtime.models.preprocessing",
    POSTPROCESSING: "trtspec.runtime.models.postprocessing",
    "orchestrator": "trtspec.runtime.models.orchestrator",
    ROUTER: "trtspec.runtime.models.router",
    "engine": "trtspec.runtime.engine.triton_model",
}


@dataclass
class EngineModel:
    name: str
    role: str
    mode: str  # a trtspec.catalogue.ENGINE_MODES name
    max_draft_len: int
    path: Path
    decoupled: bool = True
    variant: Any = None  # the spec variant for medusa/eagle/lookahead engines
    gpu_device_ids: str = ""  # trtspec.plan.placement, in the backend's format


@dataclass
class VariantModel:
    name: str
    mode: str  # "none" for the baseline
    target: str
    draft: str | None
    max_draft_len: int = 0
    num_draft_tokens: int = 0
    draft_schedule: str = "constant"
    calls: list[str] = field(default_factory=list)
    spec: Any = None  # the spec variant (None for the baseline)


@dataclass
class Layout:
    """Everything the writer needs, resolved from spec + plan."""

    spec_name: str
    backend: str
    trtllm_version: str
    engines: dict[str, EngineModel]
    variants: dict[str, VariantModel]
    tokenizer_dir: Path
    # kv_cache_free_gpu_mem_fraction per engine, from trtspec.memory's plan
    kv_fractions: dict[str, float] = field(default_factory=dict)
    # the engine flow's stream_interval (spec flow.stream_interval): tokens per
    # streamed orchestrator response after the first
    stream_interval: int = 1

    @property
    def gpu(self) -> bool:
        """TensorRT-LLM engines (Triton's tensorrtllm backend), not reference ones."""
        return gpu_backend(self.backend)


def layout_of(spec: Spec, plan: Plan, engines_root: Path) -> Layout:
    """Resolve engine and variant models from the spec and its plan."""
    backend = spec.backend.value
    spec_variants = {v.name: v for v in spec.variants}
    root = Path(os.path.abspath(Path(engines_root) / spec.name))
    engines: dict[str, EngineModel] = {}
    for engine in plan.engines:
        try:
            mode = engine_mode(engine.mode).name
        except KeyError:
            raise RepoError(
                f"engine {engine.name}: unknown mode {engine.mode!r}",
                "The plan and the repository builder disagree; rebuild with this trtspec.",
            ) from None
        engines[engine.name] = EngineModel(
            name=engine.name,
            role=engine.role,
            mode=mode,
            max_draft_len=int(engine.max_draft_len or 0),
            path=root / engine.name,
            gpu_device_ids=engine.gpu_device_ids,
        )
    variants: dict[str, VariantModel] = {}
    for name, wiring in plan.variants.items():
        target, draft = wiring.target, wiring.draft
        for engine_name in (target, draft):
            if engine_name is not None and engine_name not in engines:
                raise RepoError(
                    f"variant {name}: engine {engine_name!r} is not in the plan",
                    "Rebuild the plan with `trtspec build --dry-run` and check the spec.",
                )
        spec_variant: Any = spec_variants.get(name)
        mode = "none" if spec_variant is None else str(spec_variant.mode)
        model = VariantModel(name=name, mode=mode, target=target, draft=draft, spec=spec_variant)
        if mode in DRAFT_LOOP_MODES:
            model.max_draft_len = int(spec_variant.max_draft_len)
            sweep = list(spec_variant.num_draft_tokens or [model.max_draft_len])
            model.num_draft_tokens = max(sweep)
            model.draft_schedule = str(spec_variant.draft_schedule)
            for engine_name in filter(None, (target, draft)):
                engines[engine_name].decoupled = False
        elif mode != "none":
            engines[target].variant = spec_variant
            model.max_draft_len = engines[target].max_draft_len
        model.calls = [PREPROCESSING, POSTPROCESSING, target, *([draft] if draft else [])]
        variants[name] = model
    if BASELINE not in variants:
        raise RepoError(
            "the plan has no baseline variant",
            "Plan.variants must include `baseline` (docs/design/engines.md).",
        )
    # An engine both streamed from and called in a draft loop cannot exist:
    # the loop needs decoupled: false, streaming needs decoupled: true.
    for model in variants.values():
        if model.mode not in DRAFT_LOOP_MODES and not engines[model.target].decoupled:
            raise RepoError(
                f"engine {model.target} serves variant {model.name} (streaming) and a draft loop",
                "Give draft-loop variants their own target engine (target_dte).",
            )
    return Layout(
        spec_name=spec.name,
        backend=backend,
        trtllm_version=str(spec.stack.trtllm_version),
        engines=engines,
        variants=variants,
        tokenizer_dir=Path(os.path.abspath(spec.tokenizer_dir(engines_root))),
        stream_interval=int(getattr(spec.flow, "stream_interval", 1)),
    )


def _model_py(module: str) -> str:
    # The Python backend stub starts its interpreter without reading
    # PYTHONPATH, so the path `trtspec serve` (or the user) sets there is
    # applied here; nothing machine-specific is written into the repository.
    return (
        f'"""Generated by trtspec: the model lives in {module}."""\n'
        "\n"
        "import os\n"
        "import sys\n"
        "\n"
        "try:\n"
        f"    from {module} import TritonPythonModel\n"
        "except ImportError:\n"
        '    for _entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):\n'
        "        if _entry and _entry not in sys.path:\n"
        "            sys.path.insert(0, _entry)\n"
        f"    from {module} import TritonPythonModel\n"
        "\n"
        '__all__ = ["TritonPythonModel"]\n'
    )


def _write_model(repo: Path, name: str, config: Any, module: str | None) -> None:
    configs.write_config(repo / name / "config.pbtxt", config)
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    if module is not None:
        (version / "model.py").write_text(_model_py(module), encoding="utf-8")


def engine_config(layout: Layout, engine: EngineModel, spec: Spec) -> Any:
    contract = engine_contract(layout.trtllm_version)
    target = spec.target
    kv = target.kv_cache
    # Every engine of the repository shares the GPU(s): the memory plan splits
    # the spec's fraction by KV need (trtspec.memory.kv_fractions); an equal
    # slice when it has no plan (conservative: later loads see less free).
    fraction = layout.kv_fractions.get(
        engine.name, round(float(kv.free_gpu_mem_fraction) / max(1, len(layout.engines)), 4)
    )
    params: dict[str, object] = {
        "max_beam_width": int(target.max_beam_width),
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": str(engine.path),
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": fraction,
        # The draft loop re-sends the whole sequence every round; without
        # block reuse each round would recompute the prefix.
        "enable_kv_cache_reuse": bool(kv.enable_reuse) or not engine.decoupled,
        "exclude_input_in_output": True,
        "enable_chunked_context": False,
        "normalize_log_probs": True,
    }
    if engine.mode != "draft_tokens_external":
        # draft_tokens_external engines are auto-detected by the backend.
        params["decoding_mode"] = ENGINE_MODES[engine.mode].decoding_mode
    if engine.variant is not None:  # an in-engine mode's own parameters
        params.update(module_for(engine.variant).engine_parameters(engine.variant))
    if layout.gpu:
        params["executor_worker_path"] = EXECUTOR_WORKER
        if engine.gpu_device_ids and (target.instances > 1 or target.tp * target.pp > 1):
            # Each instance's own GPUs (plan.placement), and at TP×PP > 1 each
            # engine model's: in orchestrator mode a draft's spawned workers
            # take exactly these; in leader mode rank r takes entry r, the GPU
            # it would take anyway. One GPU, one instance needs none. Commas
            # between GPUs, ';' between instances (tensorrtllm_backend v0.19.0
            # docs/llama_multi_instance.md, model_instance_state.cc).
            params["gpu_device_ids"] = engine.gpu_device_ids
        if contract.guided_decoding_params:
            params.update(GUIDED_DECODING_OFF)
    return configs.base_config(
        engine.name,
        backend=TRITON_BACKEND[layout.backend],
        max_batch_size=int(target.max_batch_size),
        decoupled=engine.decoupled,
        instances=int(target.instances),
        inputs=contract.inputs,
        outputs=contract.outputs,
        parameters=params,
        dynamic_batching=layout.gpu,
    )


def orchestrator_config(
    layout: Layout,
    variant: VariantModel,
    tokens_per_block: int,
    lengths: dict[str, object] | None = None,
) -> Any:
    """``lengths``: a draft loop's length parameters (modes/draft_model.loop_parameters)."""
    contract = engine_contract(layout.trtllm_version)
    params: dict[str, object] = {
        "variant": variant.name,
        "mode": variant.mode,
        "preprocessing_model": PREPROCESSING,
        "postprocessing_model": POSTPROCESSING,
        "target_model": variant.target,
        "draft_model": variant.draft,
        "seed_input": contract.seed_input,
        "perf_metrics": contract.perf_metrics,
        # the engine input that asks for kv_cache_reused_blocks (0.17 on)
        "reuse_stats_input": contract.reuse_stats_input,
        # turns the target's kv_cache_reused_blocks into prefix_reused_tokens
        "tokens_per_block": int(tokens_per_block),
        # tokenize and detokenize in process, as the text models would (no BLS
        # hop per request and per streamed token: benchmarks/ceiling.py)
        "tokenizer_dir": str(layout.tokenizer_dir),
    }
    if variant.mode in DRAFT_LOOP_MODES:
        params["max_draft_len"] = variant.max_draft_len
        params["num_draft_tokens"] = variant.num_draft_tokens
        params["draft_schedule"] = variant.draft_schedule
        params.update(_loop_lengths(layout, variant, lengths))
    if variant.spec is not None:
        params.update(module_for(variant.spec).orchestrator_parameters(variant.spec))
    if layout.stream_interval > 1:  # absent = 1: a repository as before it
        params["stream_interval"] = layout.stream_interval
    return configs.base_config(
        variant.name,
        backend="python",
        max_batch_size=0,
        decoupled=True,
        inputs=ORCHESTRATOR_INPUTS,
        outputs=ORCHESTRATOR_OUTPUTS,
        parameters=params,
    )


def _loop_lengths(
    layout: Layout, variant: VariantModel, lengths: dict[str, object] | None
) -> dict[str, object]:
    """``lengths``, with ``max_input_len`` lowered to what the built engines
    of the loop say they take, where they were built before the loop's rule
    (the orchestrator then finishes without drafts instead of failing)."""
    out = dict(lengths or {})
    if "max_input_len" not in out:
        return out
    limit = int(str(out["max_input_len"]))
    for name in filter(None, (variant.target, variant.draft)):
        try:
            doc = json.loads((layout.engines[name].path / "config.json").read_text("utf-8"))
            limit = min(limit, int(doc["build_config"]["max_input_len"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not built yet (assemble without engines): the plan's value
    out["max_input_len"] = limit
    return out


def _manifest(layout: Layout, spec: Spec) -> dict[str, Any]:
    models: dict[str, Any] = {
        PREPROCESSING: {"role": "preprocessing", "calls": [], "variant": None, "mode": None},
        POSTPROCESSING: {"role": "postprocessing", "calls": [], "variant": None, "mode": None},
    }
    for engine in layout.engines.values():
        models[engine.name] = {"role": "engine", "calls": [], "variant": None, "mode": engine.mode}
    for variant in layout.variants.values():
        models[variant.name] = {
            "role": "orchestrator",
            "calls": list(variant.calls),
            "variant": variant.name,
            "mode": variant.mode,
        }
    models[ROUTER] = {
        "role": "router",
        "calls": sorted(layout.variants),
        "variant": None,
        "mode": None,
    }
    return {
        "schema_version": MANIFEST_SCHEMA_VERSION,
        "spec": layout.spec_name,
        "spec_hash": spec.spec_hash,
        "backend": layout.backend,
        "trtllm_version": layout.trtllm_version,
        "models": models,
        "variants": [*sorted(v for v in layout.variants if v != BASELINE), BASELINE],
    }


def write_tree(
    layout: Layout,
    spec: Spec,
    repo: Path,
    routing: RoutingTable,
    golden: dict[str, list[str]] | None = None,
) -> None:
    """Write every model folder and the manifest into ``repo`` (a fresh folder)."""
    pre = configs.base_config(
        PREPROCESSING,
        backend="python",
        max_batch_size=0,
        decoupled=False,
        inputs=PREPROCESSING_INPUTS,
        outputs=PREPROCESSING_OUTPUTS,
        parameters={"tokenizer_dir": str(layout.tokenizer_dir), "add_special_tokens": True},
    )
    _write_model(repo, PREPROCESSING, pre, MODEL_SOURCES[PREPROCESSING])
    post = configs.base_config(
        POSTPROCESSING,
        backend="python",
        max_batch_size=0,
        decoupled=False,
        inputs=POSTPROCESSING_INPUTS,
        outputs=POSTPROCESSING_OUTPUTS,
        parameters={"tokenizer_dir": str(layout.tokenizer_dir), "skip_special_tokens": True},
    )
    _write_model(repo, POSTPROCESSING, post, MODEL_SOURCES[POSTPROCESSING])
    for engine in layout.engines.values():
        module = None if layout.gpu else MODEL_SOURCES["engine"]
        _write_model(repo, engine.name, engine_config(layout, engine, spec), module)
    for variant in layout.variants.values():
        _write_model(
            repo,
            variant.name,
            orchestrator_config(
                layout,
                variant,
                int(spec.target.kv_cache.tokens_per_block),
                loop_parameters(spec) if variant.mode in DRAFT_LOOP_MODES else None,
            ),
            MODEL_SOURCES["orchestrator"],
        )
    router = configs.base_config(
        ROUTER,
        backend="python",
        max_batch_size=0,
        decoupled=True,
        # several router processes share their state (router.py: in-flight
        # counts, request log, metrics labelled by router_instance)
        instances=int(spec.router.instances),
        inputs=ORCHESTRATOR_INPUTS,
        outputs=ORCHESTRATOR_OUTPUTS,
        parameters={
            "routing_file": ROUTING_FILE,
            "variants": ",".join(sorted(layout.variants)),
            # run the chosen variant's generation in the router's process, one
            # hop fewer per token (runtime/models/inprocess.py: the same deadline,
            # rollout tracking, cancellation and fallback as over BLS;
            # measured by benchmarks/ceiling.py)
            "in_process_variants": True,
        },
    )
    _write_model(repo, ROUTER, router, MODEL_SOURCES[ROUTER])
    (repo / ROUTER / ROUTING_FILE).write_text(
        json.dumps(routing.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    # the rollout's settings, golden set and variant facts (trtspec.rollout)
    rollout = rollout_config(spec, layout.variants, golden)
    (repo / ROUTER / CONFIG_FILE).write_text(
        json.dumps(rollout.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (repo / MANIFEST_NAME).write_text(
        json.dumps(_manifest(layout, spec), indent=2) + "\n", encoding="utf-8"
    )


def check_engine_folders(layout: Layout) -> None:
    missing = [e for e in layout.engines.values() if not (e.path / "config.json").is_file()]
    if missing:
        first = missing[0]
        raise RepoError(
            f"{first.path / 'config.json'}: engine {first.name} is not built"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""),
            "Run `trtspec build` for this spec first, or pass --engines DIR.",
        )
    if not layout.tokenizer_dir.is_dir():
        raise RepoError(
            f"{layout.tokenizer_dir}: the target engine has no tokenizer folder",
            "Rebuild the target engine with `trtspec build`; it copies the tokenizer.",
        )


def assemble(
    spec: Spec,
    plan: Plan,
    engines_root: Path,
    output: Path,
    routing: RoutingTable | None = None,
    *,
    require_engines: bool = True,
    memory: MemoryPlan | None = None,
    golden: dict[str, list[str]] | None = None,
) -> Path:
    """Write ``output/<spec.name>/`` and return it. ``routing`` defaults to the
    spec's rollout; ``memory`` (the spec's memory plan, made once by the
    caller; planned here without a GPU size when not given) gives each GPU
    engine its KV cache fraction; ``golden`` is each route's golden set
    (``trtspec.rollout.golden``) for the router's golden diff. An existing
    repository is replaced only once the new one is complete."""
    layout = layout_of(spec, plan, Path(engines_root))
    if memory is None and spec.backend.gpu:  # a caller that planned none: without a GPU size
        from trtspec.memory import memory_plan

        memory = memory_plan(spec, plan)
    if memory is not None:
        layout.kv_fractions = memory.fractions
    if require_engines:
        check_engine_folders(layout)
    table = routed_table(spec, routing, set(layout.variants))
    return install_repository(
        Path(output), spec.name, lambda staging: write_tree(layout, spec, staging, table, golden)
    )


def routed_table(spec: Spec, routing: RoutingTable | None, variants: set[str]) -> RoutingTable:
    """``routing`` (default: the spec's rollout), refused when it routes to a
    variant the repository does not serve."""
    table = routing or routing_from_rollout(str(spec.rollout.fallback_variant))
    unknown = sorted(table.variants() - variants)
    if unknown:
        raise RepoError(
            f"routing: variant {unknown[0]!r} is not in spec {spec.name} "
            f"(variants: {', '.join(sorted(variants))})",
            "Route only to variants the spec defines, or regenerate routing.yaml.",
        )
    return table


def install_repository(output: Path, name: str, fill: Callable[[Path], None]) -> Path:
    """``output/<name>/``, filled by ``fill(staging)`` in a staging folder and
    renamed into place (an existing one is swapped out whole), so a reader
    never sees half a repository."""
    output.mkdir(parents=True, exist_ok=True)
    final = output / name
    # Not mkdtemp's 0700, which would hide the repo from other users.
    staging = make_staging_dir(f".{name}.tmp-", output)
    try:
        fill(staging)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{name}.old-", dir=output))
            os.replace(final, old / "repo")
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final
