"""A lean decoder forward for Llama-shaped models (Llama, Mistral, Qwen2).

The reference engine's step is small (one to a few dozen tokens over a cached
prefix), and on two CPU cores Hugging Face's module-by-module forward spends a
large share of such a step in Python (mask construction, cache objects, module
dispatch): about a third of an int8 draft step of SmolLM2-135M, a tenth of a
float32 one. This forward runs the same layers with the same weights and
the same torch operations straight over the model's own parameters, and reads
and writes the cache it is given (``kv_reuse.KVCache``, or a transformers
``DynamicCache`` in tests and beside a Hugging Face forward). ``fuse`` (at load, before any
quantization) stacks q/k/v and gate/up into one projection each, so a layer
makes four matrix calls instead of seven; stacking output rows does not change
any output element, and the tests check the fused forward's logits against
the model's own forward. Models it does not recognise (other architectures,
sliding windows, non-SiLU MLPs) keep the Hugging Face forward; ``supports``
says which. ``TRTSPEC_ENGINE_FASTPATH=0`` turns it off. ``lean_model.py``
builds an already fused model straight from the weight file, without
transformers, for the models this forward supports.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from trtspec.runtime.engine.kv_reuse import kv_tensors, replace_kv

FAMILIES = ("llama", "mistral", "qwen2")


def enabled() -> bool:
    """Whether the fast path is on (``TRTSPEC_ENGINE_FASTPATH`` not off)."""
    return os.environ.get("TRTSPEC_ENGINE_FASTPATH", "1").strip() not in ("0", "false", "no", "off")


def supports(model: Any) -> bool:
    """Whether ``forward`` reproduces ``model.model``'s forward for this model."""
    if not enabled():
        return False
    cfg = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if cfg is None or inner is None or getattr(cfg, "model_type", None) not in FAMILIES:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if getattr(cfg, "sliding_window", None) and (
        cfg.model_type == "mistral" or getattr(cfg, "use_sliding_window", False)
    ):
        return False
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        return False
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if not all(hasattr(inner, name) for name in needed):
        return False
    layer = inner.layers[0]
    attn = getattr(layer, "self_attn", None)
    mlp = getattr(layer, "mlp", None)
    return (
        attn is not None
        and mlp is not None
        and all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        and all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj"))
    )


def _stack(linears: list[Any]) -> Any:
    """One ``nn.Linear`` whose output is the concatenation of ``linears``' outputs.

    Built on the meta device and given the stacked tensors as its parameters:
    a plain ``nn.Linear(...)`` would first fill a weight of the fused size with
    random values (Kaiming init), about a second per layer of a 135M model on
    two busy cores, only to overwrite it."""
    import torch
    from torch import nn

    weight = torch.cat([m.weight.detach() for m in linears])
    has_bias = any(m.bias is not None for m in linears)
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device="meta")
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if has_bias:
        bias = torch.cat(
            [
                m.bias.detach() if m.bias is not None else torch.zeros(m.out_features)
                for m in linears
            ]
        )
        fused.bias = nn.Parameter(bias, requires_grad=False)
    return fused.eval()


def fuse(model: Any) -> bool:
    """Stack each layer's q/k/v and gate/up projections (in place) when the
    fast path ``supports`` the model; returns whether it did. The model's own
    forward cannot run afterwards, only ``forward`` here."""
    if not supports(model):
        return False
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _stack([attn.q_proj, attn.k_proj, attn.v_proj])
        mlp.gate_up_proj = _stack([mlp.gate_proj, mlp.up_proj])
        for owner, name in (
            (attn, "q_proj"),
            (attn, "k_proj"),
            (attn, "v_proj"),
            (mlp, "gate_proj"),
            (mlp, "up_proj"),
        ):
            delattr(owner, name)
    model._trtspec_fused = True
    return True


def is_fused(model: Any) -> bool:
    return bool(getattr(model, "_trtspec_fused", False))


def _linear_fn(module: Any) -> Any:
    """The cheapest call computing ``module(x)``: the packed or quantized op
    itself, without the module's Python dispatch (a draft step makes ~120)."""
    import torch

    if getattr(module, "packed", None) is not None:
        return module.forward  # PackedLinear: already a direct op call
    params = getattr(getattr(module, "_packed_params", None), "_packed_params", None)
    if (
        params is not None
        and getattr(module, "version", None) == 4
        and module._packed_params.dtype == torch.qint8
    ):
        op = torch.ops.quantized.linear_dynamic.default
        return lambda x: op(x, params, True)
    return module


@dataclass(frozen=True)
class _Plan:
    """What ``forward`` needs from a fused model, derived once per model."""

    layers: list[tuple[Any, ...]]  # (input norm w, qkv, o, post norm w, gate_up, down)
    n_heads: int
    n_kv: int
    head_dim: int
    eps: float
    split_qkv: tuple[int, int]
    split_mlp: tuple[int, int]


def _plan(model: Any) -> _Plan:
    plan = getattr(model, "_trtspec_plan", None)
    if plan is None:
        cfg = model.config
        n_heads = int(cfg.num_attention_heads)
        n_kv = int(getattr(cfg, "num_key_value_heads", None) or n_heads)
        head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads)
        plan = _Plan(
            layers=[
                (
                    layer.input_layernorm.weight,
                    _linear_fn(layer.self_attn.qkv_proj),
                    _linear_fn(layer.self_attn.o_proj),
                    layer.post_attention_layernorm.weight,
                    _linear_fn(layer.mlp.gate_up_proj),
                    _linear_fn(layer.mlp.down_proj),
                )
                for layer in model.model.layers
            ],
            n_heads=n_heads,
            n_kv=n_kv,
            head_dim=head_dim,
            eps=float(cfg.rms_norm_eps),
            split_qkv=((n_heads + n_kv) * head_dim, n_kv * head_dim),
            split_mlp=(int(cfg.intermediate_size),) * 2,
        )
        model._trtspec_plan = plan
    return plan


def _rms(x: Any, weight: Any, eps: float) -> Any:
    import torch.nn.functional as F

    # One op for HF's pow/mean/rsqrt/mul/mul (same arithmetic, same result).
    return F.rms_norm(x, weight.shape, weight, eps)


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def forward(
    model: Any, ids: Any, cache: Any, *, position_ids: Any = None, attention_mask: Any = None
) -> Any:
    """Run ``ids`` [1, T] through a ``fuse``d model after the ``cache``'s positions;
    returns the final hidden states [T, hidden] and appends the new keys/values
    to ``cache``.

    ``attention_mask`` is an additive or boolean 4-D mask [1, 1, T, past + T]
    (tree verification); without one, attention is causal. ``position_ids``
    default to ``past .. past + T - 1``."""
    segment = Segment(cache, int(ids.shape[1]), position_ids, attention_mask)
    return forward_packed(model, ids, [segment])


@dataclass
class Segment:
    """One sequence's rows in a packed forward: its own cache (appended to),
    its row count, and optional ``position_ids`` [1, rows] / 4-D mask as in
    ``forward``."""

    cache: Any
    rows: int
    position_ids: Any = None
    attention_mask: Any = None


def row_independent(model: Any) -> bool:
    """Whether every projection computes each row independently of the others
    (oneDNN-packed float32: checked bit for bit by the tests), so sequences can
    share one matrix call. Dynamic int8 quantizes activations with one scale
    per call, and MKL's sgemm picks kernels by row count: those run per sequence."""
    plan = _plan(model)
    fns = [fn for layer in plan.layers for fn in layer[1:] if callable(fn)]
    return all(getattr(getattr(fn, "__self__", None), "packed", None) is not None for fn in fns)


def _per_segment(fn: Any, x: Any, bounds: list[tuple[int, int]], shared: bool) -> Any:
    import torch

    if shared or len(bounds) == 1:
        return fn(x)
    return torch.cat([fn(x[:, a:b]) for a, b in bounds], dim=1)


def forward_packed(model: Any, ids: Any, segments: list[Segment]) -> Any:
    """``forward`` for several sequences at once, packed without padding
    (TRT-LLM's ``remove_input_padding`` layout): ``ids`` [1, sum(rows)] holds
    each segment's tokens in order; the projections and the MLP see one matrix
    of all rows (one weight read per step), attention runs per segment over
    that segment's own cache exactly as ``forward`` runs it alone. Returns the
    final hidden states [sum(rows), hidden]; each segment's cache grows by its
    rows."""
    import torch
    import torch.nn.functional as F

    inner = model.model
    plan = _plan(model)
    n_heads, n_kv, head_dim, eps = plan.n_heads, plan.n_kv, plan.head_dim, plan.eps
    shared = len(segments) == 1 or _row_independent_cached(model)
    bounds: list[tuple[int, int]] = []
    pasts: list[list[tuple[Any, Any]]] = []
    masks: list[tuple[Any, bool]] = []
    positions = []
    start = 0
    for seg in segments:
        past_kv = kv_tensors(seg.cache) if seg.cache.layers else []
        past = int(past_kv[0][0].shape[-2]) if past_kv else 0
        q_len = seg.rows
        bounds.append((start, start + q_len))
        start += q_len
        pasts.append(past_kv)
        pos = seg.position_ids
        if pos is None:
            pos = torch.arange(past, past + q_len, dtype=torch.long)[None]
        positions.append(pos)
        mask = seg.attention_mask
        causal = False
        if mask is None and q_len > 1:
            if past:
                mask = torch.ones(q_len, past + q_len, dtype=torch.bool).tril(past)
            else:
                causal = True
        masks.append((mask, causal))
    total = start
    position_ids = positions[0] if len(positions) == 1 else torch.cat(positions, dim=1)
    x = inner.embed_tokens(ids)
    cos, sin = inner.rotary_emb(x, position_ids)
    cos, sin = cos[:, None], sin[:, None]
    new_kv: list[list[tuple[Any, Any]]] = [[] for _ in segments]
    for i, (w_in, qkv_proj, o_proj, w_post, gate_up_proj, down_proj) in enumerate(plan.layers):
        h = _rms(x, w_in, eps)
        qk, v = _per_segment(qkv_proj, h, bounds, shared).split(plan.split_qkv, dim=-1)
        # queries and keys rotated together: one set of element-wise ops per layer
        qk = qk.reshape(1, total, n_heads + n_kv, head_dim).transpose(1, 2)
        qk = qk * cos + _rotate_half(qk) * sin
        v = v.reshape(1, total, n_kv, head_dim).transpose(1, 2)
        outs = []
        for s, (a, b) in enumerate(bounds):
            q, k, vs = qk[:, :n_heads, a:b], qk[:, n_heads:, a:b], v[:, :, a:b]
            if pasts[s]:
                k = torch.cat([pasts[s][i][0], k], dim=-2)
                vs = torch.cat([pasts[s][i][1], vs], dim=-2)
            new_kv[s].append((k, vs))
            mask, causal = masks[s]
            outs.append(
                F.scaled_dot_product_attention(
                    q, k, vs, attn_mask=mask, is_causal=causal, enable_gqa=n_kv != n_heads
                )
            )
        o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        o = o.transpose(1, 2).reshape(1, total, n_heads * head_dim)
        x = x + _per_segment(o_proj, o, bounds, shared)
        gate, up = _per_segment(gate_up_proj, _rms(x, w_post, eps), bounds, shared).split(
            plan.split_mlp, dim=-1
        )
        x = x + _per_segment(down_proj, F.silu(gate) * up, bounds, shared)
    for seg, kv in zip(segments, new_kv, strict=True):
        replace_kv(seg.cache, kv)
    return _rms(x, inner.norm.weight, eps)[0]


def _row_independent_cached(model: Any) -> bool:
    flag = getattr(model, "_trtspec_row_independent", None)
    if flag is None:
        flag = row_independent(model)
        model._trtspec_row_independent = flag
    return bool(flag)
