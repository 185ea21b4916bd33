"""The LLM-API flow: TensorRT-LLM's PyTorch flow, one LLM-argument YAML per
variant (plus the baseline), served by Triton's ``llmapi`` Python model
(the YAML as ``model.yaml``) or by ``trtllm-serve MODEL --config FILE``.

Per variant mode (``speculative_config.decoding_type`` at each pinned version):

| spec mode | 1.2.1 | 1.3.0rc22 |
|---|---|---|
| ``draft_model`` | ``Draft_Target`` + ``speculative_model`` | same |
| ``ngram`` | ``NGram`` (per-request pool) | ``NGram``, or ``SA`` with ``flow.suffix_automaton`` |
| ``eagle`` | ``Eagle3``, one model, linear chain of ``num_eagle_layers`` | same |
| ``mtp`` | ``MTP`` with ``num_nextn_predict_layers`` | ``MTP`` with ``max_draft_len`` |
| ``medusa``, ``lookahead`` | refused: engine flow only | refused |

The target's limits, KV cache (each variant is its own ``LLM`` on the same
GPUs: with a GPU size, ``trtspec.flows.llmapi_memory`` gives each its
``max_tokens``; without one the fraction is split evenly), block reuse, block
size, parallelism and dtype carry over from the spec. Every file enables the
iteration stats trtllm-serve's spec-decode counters come from; one-model
variants (Eagle3, MTP) of a spec that samples set ``allow_advanced_sampling``.
Every generated document is checked against the pinned version's field table
(``trtspec.runtime.llm_args``) before it is written; a problem there is a
trtspec bug and raised as one.

On the reference backend (CPU) the same documents name the reference engine
folders the plan builds (``target``, ``target_dte``, ``draft_*``) instead of
the Hugging Face checkpoints, and ``trtspec.runtime.engine.llmapi_model`` serves them
with the ``llmapi`` model's tensors; EAGLE-3 and MTP need a GPU there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trtspec.catalogue import BASELINE
from trtspec.errors import TrtspecError
from trtspec.fsutil import atomic_write_text
from trtspec.runtime.llm_args import validate_llm_args
from trtspec.spec.flows import LLM_SUFFIX, LlmApiFlowSpec
from trtspec.vocab import Backend

if TYPE_CHECKING:
    from trtspec.artifacts.routing import RoutingTable
    from trtspec.memory import MemoryPlan
    from trtspec.plan import Plan
    from trtspec.spec import Spec

CONFIG_DIR = "llmapi"  # engines/<spec>/llmapi/<variant>.yaml
#: triton_config keys of the llmapi model.yaml (model.py pops the whole section)
CANCELLATION_CHECK_PERIOD_MS = 100


class LlmApiError(TrtspecError):
    """An LLM-argument file trtspec generated fails its version's field table."""


def settings(spec: Spec) -> LlmApiFlowSpec:
    """The spec's ``flow`` section (this module serves LLM-API specs only)."""
    if not isinstance(spec.flow, LlmApiFlowSpec):
        raise LlmApiError(f"spec {spec.name} does not use the LLM-API flow (flow: llmapi)")
    return spec.flow


def llm_model_name(variant: str) -> str:
    return f"{variant}{LLM_SUFFIX}"


def variant_names(spec: Spec) -> list[str]:
    return [BASELINE, *(v.name for v in spec.variants)]


def _merge(doc: dict[str, Any], extra: dict[str, Any], speculative: bool) -> dict[str, Any]:
    out = dict(doc)
    for key, value in extra.items():
        if key == "speculative_config" and not speculative:
            continue
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


#: Decoding types whose draft runs inside the target's forward pass (one
#: model): no ``Drafter``, so 1.2.1's ``max_concurrency`` (read by
#: ``Drafter.should_use_spec_decode``, tensorrt_llm/_torch/speculative/drafter.py)
#: never applies to them, and at 1.2.1 they sample greedily unless
#: ``allow_advanced_sampling`` is true ("Only applicable to 1-model code
#: paths", DecodingBaseConfig in llm_args.py, search-index file id 7019226376).
ONE_MODEL = ("Eagle3", "MTP")


def samples(spec: Spec) -> bool:
    """Whether any route is measured (or served) at a temperature above 0."""
    temps = [*spec.bench.temperatures]
    for route in spec.routes.values():
        temps += route.temperatures or []
    return any(t > 0 for t in temps)


def greedy_at(spec: Spec, temperatures: list[float] | None) -> str | None:
    """Why a bench at ``temperatures`` (``--temperatures``) would measure a
    one-model variant greedily: its file was written for the spec's own
    temperatures, all 0, so without ``allow_advanced_sampling``; None if not."""
    if not isinstance(spec.flow, LlmApiFlowSpec) or samples(spec):
        return None
    if not any(t > 0 for t in temperatures or []):
        return None
    one_model = [v.name for v in spec.variants if v.mode in ("eagle", "mtp")]
    if not one_model or settings(spec).trtllm_version != "1.2.1":
        return None
    return (
        f"variant(s) {', '.join(one_model)} were written without "
        "speculative_config.allow_advanced_sampling (the spec's temperatures are all 0), and "
        "TensorRT-LLM 1.2.1's one-model paths then decode greedily at any temperature: add "
        "the temperature to bench.temperatures (or the route's) and rebuild the repository"
    )


def limit_honoured(spec: Spec, speculative: dict[str, Any]) -> bool:
    """Whether ``speculative_config.max_concurrency`` acts at the pinned
    version for this decoding type and can be written beside what the
    spec's ``llm_args`` already set: 1.2.1 reads it in the two-model
    drafter only; 1.3 turns it into a ``draft_len_schedule`` and refuses
    both together (``llm_args.rules``). The router's own route limit holds
    either way."""
    from trtspec.runtime.llm_args import rules

    version = settings(spec).trtllm_version
    if version == "1.2.1" and speculative.get("decoding_type") in ONE_MODEL:
        return False
    exclusive = {n for group in rules(version)["exclusive"] for n in group}
    return not ("max_concurrency" in exclusive and speculative.get("draft_len_schedule"))


# ---------------------------------------------------------- configuration
def _speculative(spec: Spec, v: Any, draft_path: str | None) -> dict[str, Any] | None:
    version = settings(spec).trtllm_version
    if v is None:
        return None
    if v.mode == "ngram":
        if settings(spec).suffix_automaton:
            return {"decoding_type": "SA", "max_draft_len": v.max_draft_len}
        return {
            "decoding_type": "NGram",
            "max_draft_len": v.max_draft_len,
            "max_matching_ngram_size": v.max_matching_ngram_size,
            # trtspec's n-gram variants look up each request's own prompt and output
            "is_public_pool": False,
        }
    if v.mode == "draft_model":
        return {
            "decoding_type": "Draft_Target",
            "max_draft_len": v.max_draft_len,
            "speculative_model": draft_path,
        }
    # one-model paths at T>0: 1.2.1 samples only with allow_advanced_sampling;
    # at 1.3 (llm_args.py at 0004396) it is a deprecated no-op that is still
    # accepted, so it is written for both rather than guessed per commit
    sampling = {"allow_advanced_sampling": True} if samples(spec) else {}
    if v.mode == "eagle":
        return {
            "decoding_type": "Eagle3",
            "max_draft_len": v.num_eagle_layers,
            "speculative_model": draft_path,
            "eagle3_one_model": True,
            **sampling,
        }
    if v.mode == "mtp":
        if version == "1.2.1":
            return {
                "decoding_type": "MTP",
                "num_nextn_predict_layers": v.max_draft_len,
                **sampling,
            }
        return {"decoding_type": "MTP", "max_draft_len": v.max_draft_len, **sampling}
    raise LlmApiError(f"mode {v.mode!r} has no LLM-API configuration")  # refused by the checks


def llm_args(
    spec: Spec,
    variant: Any,
    *,
    model: str,
    draft: str | None = None,
    kv_tokens: int | None = None,
) -> dict[str, Any]:
    """The LLM-argument document of one variant (``variant`` None = the baseline):
    what ``trtllm-serve --config`` takes; ``model_yaml`` adds ``triton_config``.
    ``kv_tokens``: the variant's KV budget from the memory plan
    (``llmapi_memory.kv_tokens``), written as ``max_tokens`` under the spec's
    fraction; without it the fraction is split evenly (which the load order
    makes uneven: ``llmapi_memory.UNEVEN_SPLIT``)."""
    t = spec.target
    share = t.kv_cache.free_gpu_mem_fraction / len(variant_names(spec))
    if kv_tokens is not None:
        share = t.kv_cache.free_gpu_mem_fraction
    doc: dict[str, Any] = {
        "model": model,
        "backend": "pytorch",
        "tensor_parallel_size": t.tp,
        "pipeline_parallel_size": t.pp,
        # null in the spec = the checkpoint's own dtype, as the LLM API reads it
        "dtype": t.dtype.value if t.dtype is not None else "auto",
        "max_batch_size": t.max_batch_size,
        "max_input_len": t.max_input_len,
        "max_seq_len": t.max_seq_len,
        "max_num_tokens": t.max_num_tokens,
        "max_beam_width": t.max_beam_width,
        "kv_cache_config": {
            # every variant is its own LLM in one server
            "free_gpu_memory_fraction": round(share, 4),
            **({"max_tokens": kv_tokens} if kv_tokens is not None else {}),
            "enable_block_reuse": t.kv_cache.enable_reuse,
            "tokens_per_block": t.kv_cache.tokens_per_block,
        },
        # per-request perf metrics (the llmapi model's timing outputs) and,
        # with iteration stats, trtllm-serve's spec-decode counters: its
        # stats collector runs only with both (serve/openai_server.py at
        # 00057725); every variant alike, so the baseline pays the same
        "return_perf_metrics": True,
        "enable_iter_perf_stats": True,
    }
    if not settings(spec).cuda_graphs:
        doc["cuda_graph_config"] = None
    speculative = _speculative(spec, variant, draft)
    if speculative is not None:
        doc["speculative_config"] = speculative
    return _merge(doc, settings(spec).llm_args, speculative is not None)


def model_yaml(spec: Spec, doc: dict[str, Any]) -> dict[str, Any]:
    """The Triton ``llmapi`` model's ``model.yaml``: the LLM arguments plus
    ``triton_config`` (which model.py removes before ``LLM(**args)``)."""
    return {
        **doc,
        "triton_config": {
            "max_batch_size": 0,
            "decoupled": settings(spec).decoupled,
            "cancellation_check_period_ms": CANCELLATION_CHECK_PERIOD_MS,
        },
    }


def model_paths(spec: Spec, plan: Plan | None) -> dict[str, tuple[str, str | None]]:
    """variant -> (model, speculative model) as the config names them: the
    Hugging Face checkpoints on a GPU, the reference engine folders on CPU."""
    out: dict[str, tuple[str, str | None]] = {}
    by_name = {v.name: v for v in spec.variants}
    for name in variant_names(spec):
        v = by_name.get(name)
        if spec.backend is Backend.reference:
            assert plan is not None
            ve = plan.variants[name]
            target = str(Path(os.path.abspath(plan.engine(ve.target).dir)))
            draft = str(Path(os.path.abspath(plan.engine(ve.draft).dir))) if ve.draft else None
            out[name] = (target, draft)
            continue
        target = spec.model_location(spec.target.model).ref
        draft = None
        if v is not None and v.mode == "draft_model":
            draft = spec.model_location(v.draft.model).ref
        elif v is not None and v.mode == "eagle":
            draft = spec.model_location(v.checkpoint).ref
        out[name] = (target, draft)
    return out


def decided_limits(routing: RoutingTable | None) -> dict[str, int]:
    """variant -> the load up to which the bench promoted it: the smallest
    ``max_concurrency`` over the routes routed to it (``routing.yaml``)."""
    limits: dict[str, int] = {}
    for rule in routing.routes.values() if routing else []:
        if rule.max_concurrency is not None:
            limits[rule.variant] = min(
                limits.get(rule.variant, rule.max_concurrency), rule.max_concurrency
            )
    return limits


def documents(
    spec: Spec,
    plan: Plan | None,
    routing: RoutingTable | None = None,
    kv_tokens: dict[str, int] | None = None,
) -> dict[str, dict[str, Any]]:
    """variant (baseline included) -> its LLM-argument document, each checked
    against the pinned version's field table. A decision that promoted a
    variant only up to some load (``routing``) is written where the LLM API
    reads it: ``speculative_config.max_concurrency`` (speculation off above
    it), where the pinned version honours it (``limit_honoured``); the
    router's route limit sends the load above it to the fallback in any case.
    ``kv_tokens``: LLM model name -> its ``kv_cache_config.max_tokens``."""
    by_name = {v.name: v for v in spec.variants}
    limits = decided_limits(routing)
    docs: dict[str, dict[str, Any]] = {}
    for name, (model, draft) in model_paths(spec, plan).items():
        tokens = (kv_tokens or {}).get(llm_model_name(name))
        doc = llm_args(spec, by_name.get(name), model=model, draft=draft, kv_tokens=tokens)
        sc = doc.get("speculative_config")
        if name in limits and sc is not None and limit_honoured(spec, sc):
            doc["speculative_config"] = {**sc, "max_concurrency": limits[name]}
        problems = validate_llm_args(
            doc, settings(spec).trtllm_version, f"{CONFIG_DIR}/{name}.yaml"
        )
        if problems:
            raise LlmApiError(
                "a generated LLM-API configuration fails its field table:\n  "
                + "\n  ".join(problems),
                "This is a trtspec bug; please report it with the spec.",
            )
        docs[name] = doc
    return docs


def trtllm_serve_argv(
    spec: Spec, doc: dict[str, Any], config: Path, *, port: int, host: str = "127.0.0.1"
) -> list[str]:
    """The ``trtllm-serve`` command serving one variant's file (OpenAI API on
    ``host:port``). ``--extra_llm_api_options`` is the option name every pinned
    version takes (newer ones add ``--config`` as its alias); the file's keys
    override the command line's."""
    return [
        "trtllm-serve",
        str(doc["model"]),
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        "pytorch",
        "--extra_llm_api_options",
        str(config),
    ]


def serve_commands(
    spec: Spec, plan: Plan, engines_root: Path, *, base_port: int = 8000, host: str = "127.0.0.1"
) -> dict[str, list[str]]:
    """variant -> its ``trtllm-serve`` argv, one port each from ``base_port``
    (baseline first, then the spec's order), reading ``engines/<spec>/llmapi/``."""
    folder = Path(engines_root) / spec.name / CONFIG_DIR
    return {
        name: trtllm_serve_argv(spec, doc, folder / f"{name}.yaml", port=base_port + i, host=host)
        for i, (name, doc) in enumerate(documents(spec, plan).items())
    }


def dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)


def kv_budgets(memory: MemoryPlan | None) -> dict[str, int] | None:
    """LLM model name -> ``kv_cache_config.max_tokens`` from the memory plan
    (``llmapi_memory``; None for the reference backend) made with a GPU size;
    None otherwise."""
    if memory is None or memory.gpu is None:
        return None
    return memory.kv_tokens


def config_files(
    spec: Spec, plan: Plan, engines_root: Path, *, memory: MemoryPlan | None = None
) -> dict[Path, str]:
    """``engines/<spec>/llmapi/<variant>.yaml`` for every variant (what
    ``trtllm-serve --config`` reads) -> its text; a memory plan made with a
    GPU size gives each variant its KV budget (``kv_budgets``)."""
    folder = Path(engines_root) / spec.name / CONFIG_DIR
    docs = documents(spec, plan, kv_tokens=kv_budgets(memory))
    return {folder / f"{name}.yaml": dump(doc) for name, doc in docs.items()}


def write_files(files: dict[Path, str]) -> list[Path]:
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return list(files)
