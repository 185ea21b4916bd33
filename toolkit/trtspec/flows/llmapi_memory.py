"""The GPU memory plan of an LLM-API spec: every variant (the baseline
included) is its own ``LLM`` — its own Triton ``llmapi`` stub process or
``trtllm-serve`` — on the same GPUs (``tensor_parallel_size`` ×
``pipeline_parallel_size`` of them, all variants alike), so each one loads its
own copy of the target, its draft (a draft model, an EAGLE-3 head; MTP's
layers are part of the target checkpoint) and its own KV cache.

The estimates reuse ``trtspec.memory``'s reading of ``config.json`` (weights,
KV bytes per token). The KV split: TensorRT-LLM sizes a KV cache at load from
``kv_cache_config.free_gpu_memory_fraction`` of the memory free *then*, so
the same fraction in every variant gives the first one loaded far more than
the last (Triton loads models in parallel and in no fixed order). With a GPU
size the plan therefore gives each variant an absolute budget,
``kv_cache_config.max_tokens`` — "if both max_tokens and
free_gpu_memory_fraction are specified, memory corresponding to the minimum
will be used" (KvCacheConfig.max_tokens in llm_args.py, search-index file id
7019226376, the 1.2 table's source) — its share of the pool left after every
variant's weights, in proportion to what a full batch needs and never above
it, rounded down to whole blocks; the fraction stays the spec's as the upper
bound. Whatever the load order, no variant takes more than its tokens and
each finds them free. Without a GPU size the fraction is split evenly and
``validate`` says that this split depends on the load order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.catalogue import BASELINE
from trtspec.memory import (
    DTYPE_BYTES,
    LOGITS_BYTES,
    PROCESS_RESERVE_BYTES,
    EngineMemory,
    Fit,
    MemoryPlan,
    MemoryPlanError,
    ModelShape,
    find_config,
    read_config,
)

#: Why an even split of free_gpu_memory_fraction is not what it says.
UNEVEN_SPLIT = (
    "each variant's KV cache is free_gpu_memory_fraction of the memory free when it loads, "
    "so the even split gives the variant loaded first the most; pass --gpu-memory to give "
    "each variant kv_cache_config.max_tokens of its own (independent of the load order)"
)


def _shape(spec: Any, ref: str, root: Path | None) -> tuple[ModelShape | None, str | None, str]:
    path = find_config(spec, ref, root)
    if path is None:
        return None, None, f"{ref}: config.json not on this machine"
    try:
        return ModelShape.from_config(read_config(path), str(path)), str(path), ""
    except MemoryPlanError as exc:
        return None, None, exc.message


def _draft_params(spec: Any, v: Any, target: ModelShape, root: Path | None) -> tuple[int, int, str]:
    """(draft parameters, draft attention layers in the KV pool, note) of a variant."""
    if v is None or v.mode == "ngram":
        return 0, 0, ""
    if v.mode == "draft_model":
        shape, _, note = _shape(spec, v.draft.model, root)
        if shape is None:
            return -1, 0, note
        return shape.parameters(), shape.layers, "+draft model"
    if v.mode == "eagle":
        # EAGLE-3 head: its decoder layer(s) and an fc over 3 target hidden states
        # (Eagle3DraftModel in tensorrt_llm/_torch/models/modeling_speculative.py)
        shape, _, _ = _shape(spec, v.checkpoint, root)
        layers = shape.layers if shape is not None else 1
        h = target.hidden
        return layers * target.layer_linear_params() + 3 * h * h + 4 * h, layers, "+EAGLE-3 head"
    if v.mode == "mtp":
        # MTP layers ship in the target checkpoint (num_nextn_predict_layers)
        path = find_config(spec, spec.target.model, root)
        n = int(read_config(path).get("num_nextn_predict_layers") or 0) if path else 0
        return n * target.layer_linear_params(), n, f"+{n} MTP layer(s)"
    return 0, 0, ""


def llm_memory(spec: Any, root: Path | None) -> list[EngineMemory]:
    """One estimate per variant's LLM, per GPU of the TP×PP group."""
    from trtspec.spec.flows import LLM_SUFFIX

    t = spec.target
    dtype = spec.dtype
    gpus = int(t.tp) * int(t.pp)
    shape, config, note = _shape(spec, t.model, root)
    by_name = {v.name: v for v in spec.variants}
    out: list[EngineMemory] = []
    for name in [BASELINE, *by_name]:
        v = by_name.get(name)
        mem = EngineMemory(
            name=f"{name}{LLM_SUFFIX}",  # its Triton model, as llmapi_config names it
            role="llm",
            model=t.model,
            dtype=dtype,
            quantization=t.quantization.value,
            gpus=gpus,
        )
        mem.max_seq_len, mem.max_num_tokens = int(t.max_seq_len), int(t.max_num_tokens)
        if shape is None:
            mem.note = note
            out.append(mem)
            continue
        extra, draft_layers, mem.note = _draft_params(spec, v, shape, root)
        if extra < 0:
            out.append(mem)  # the draft's config.json is not here: unknown
            continue
        mem.config = config
        dbytes = DTYPE_BYTES[dtype]
        weights = shape.weight_bytes(dtype, t.quantization.value) + int(extra * dbytes)
        act = mem.max_num_tokens * (2 * shape.intermediate + 4 * shape.hidden) * dbytes
        act += (
            int(t.max_batch_size)
            * (int(getattr(v, "max_draft_len", 0) or 0) + 1)
            * (shape.vocab * LOGITS_BYTES)
        )
        mem.weights = weights // gpus
        # each LLM is a process of its own: its CUDA context too
        mem.activations = int(act) // gpus + PROCESS_RESERVE_BYTES
        mem.kv_per_token = shape.kv_bytes_per_token(dtype, int(t.tp), int(t.pp), draft_layers)
        block = int(t.kv_cache.tokens_per_block)
        mem.kv_min = -(-mem.max_seq_len // block) * block * mem.kv_per_token
        mem.kv_full = int(t.max_batch_size) * mem.kv_min
        out.append(mem)
    return out


def _variant(llm_name: str) -> str:
    from trtspec.spec.flows import LLM_SUFFIX

    return llm_name.removesuffix(LLM_SUFFIX)


def llmapi_memory_plan(spec: Any, root: Path | None, gpu_bytes: int | None) -> MemoryPlan:
    """Every variant's LLM on the same GPUs (the repository, one server) and
    each alone, with the KV budget per variant (``max_tokens``)."""
    llms = llm_memory(spec, root)

    def fit(name: str, members: list[EngineMemory]) -> Fit:
        return Fit(
            name=name,
            engines=[m.name for m in members],
            fixed=sum(m.fixed for m in members),
            kv_min=sum(m.kv_min for m in members),
            kv_full=sum(m.kv_full for m in members),
            gpu=gpu_bytes,
            known=all(m.known for m in members),
        )

    fits = [fit("repository", llms)] + [fit(_variant(m.name), [m]) for m in llms]
    mp = MemoryPlan(
        engines=llms,
        fits=fits,
        gpu=gpu_bytes,
        kv_fraction=float(spec.target.kv_cache.free_gpu_mem_fraction),
        gpus=int(spec.target.tp) * int(spec.target.pp),
    )
    mp.fractions = {m.name: mp.kv_fraction for m in llms} if gpu_bytes else {}
    mp.kv_tokens = kv_tokens(mp, int(spec.target.kv_cache.tokens_per_block))
    return mp


def kv_tokens(mp: MemoryPlan, tokens_per_block: int) -> dict[str, int]:
    """LLM model name -> ``kv_cache_config.max_tokens``: its share of the KV
    pool (the spec's fraction of what every variant's weights and overhead
    leave) in proportion to its full-batch need, capped at that need, in whole
    blocks; empty without a GPU size or with a model not on this machine."""
    if mp.gpu is None or not mp.known or not mp.engines:
        return {}
    repo = mp.fits[0]
    pool = max(0.0, (mp.gpu - repo.fixed) * mp.kv_fraction)
    want = sum(m.kv_full for m in mp.engines) or 1
    out: dict[str, int] = {}
    for m in mp.engines:
        share = min(float(m.kv_full), pool * m.kv_full / want)
        tokens = int(share // max(1, m.kv_per_token))
        out[m.name] = max(tokens_per_block, tokens // tokens_per_block * tokens_per_block)
    return out
