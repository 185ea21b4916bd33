"""Loading a Llama-shaped engine model without transformers (the lean loader).

An engine stub that imports transformers' modeling stack to load its weights
pays ~3 CPU-s of imports (``AutoModelForCausalLM`` and the Llama modules pull
in ``torch.distributed.tensor``, ``torch._dynamo`` and sympy) plus
``from_pretrained`` itself, for a model the fast path (``fastpath.py``) then
runs on the bare weights anyway. ``load_lean`` reads ``hf/config.json`` and
``hf/model.safetensors`` directly (a small header parser and one
copy-on-write memory map of the file, so every tensor is a view of the
mapping as ``from_pretrained``'s are) and builds only what the fast path,
``decode.py``, ``batching.py``, ``heads.build_medusa`` and ``loader.py`` read:
``model.model.embed_tokens``, ``.layers[i]`` with the fused ``qkv_proj`` /
``o_proj`` / ``gate_up_proj`` / ``down_proj`` (stacked as ``fastpath._stack``
stacks the Hugging Face model's, and packed or quantized as each is built)
and the two norms,
``.norm``, ``.rotary_emb``, ``model.lm_head`` (the embedding's own parameter
when tied), ``model.config`` (the attributes ``fastpath`` reads, under
transformers' names) and ``get_input_embeddings`` / ``get_output_embeddings``.

It is used only where it is exactly equivalent to ``AutoModelForCausalLM``
+ ``fastpath.fuse``: ``model_type`` llama, mistral or qwen2; SiLU; every
layer full attention (no sliding window: mistral must say
``"sliding_window": null``, qwen2 must not use one); RoPE of type
``default`` with an explicit theta (no scaling of any kind); one
``model.safetensors`` holding exactly the expected float32 tensors in the
expected shapes (biases as each family's modeling code creates them: llama
``attention_bias`` / ``mlp_bias``, qwen2 q/k/v only, mistral none; no
``lm_head.weight`` when tied, one when not); no ``quantization_config``. For
anything else ``load_lean`` returns ``None`` with the reason and the loader
takes the Hugging Face path, which also stays the path for EAGLE engines (the
EAGLE layer is a transformers ``LlamaModel``), for ``TRTSPEC_ENGINE_FASTPATH=0``
and for ``TRTSPEC_ENGINE_LEAN=0``.

The rotary embedding computes cos/sin with exactly transformers' default
RoPE operations (``LlamaRotaryEmbedding`` / ``compute_default_rope_parameters``
of transformers 5.24, identical for Mistral and Qwen2): ``inv_freq = 1 /
theta ** (arange(0, dim, 2, float32) / dim)``, ``freqs = positions.float() *
inv_freq``, ``cat(freqs, freqs)``, ``cos``/``sin`` times the attention
scaling (1.0 for the default type); the tests compare the tensors bit for bit
with the installed transformers' and the logits of the whole model with the
Hugging Face-loaded one. It imports torch and numpy only.
"""

from __future__ import annotations

import functools
import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAMILIES = ("llama", "mistral", "qwen2")
_MAX_HEADER = 64 * 1024 * 1024


def enabled() -> bool:
    """Whether the lean loader may be tried (``TRTSPEC_ENGINE_LEAN`` not off)."""
    return os.environ.get("TRTSPEC_ENGINE_LEAN", "1").strip() not in ("0", "false", "no", "off")


@dataclass
class LeanConfig:
    """The config attributes the engine reads, under transformers' names."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    rope_theta: float
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    hidden_act: str = "silu"
    sliding_window: None = None
    use_sliding_window: bool = False
    layer_types: list[str] = field(default_factory=list)


class Unsupported(Exception):
    """Why a model folder takes the Hugging Face path."""


def _int(cfg: dict[str, Any], key: str) -> int:
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise Unsupported(f"config.json field {key} is {value!r}, not a positive integer")
    return value


def _flag(cfg: dict[str, Any], key: str) -> bool:
    value = cfg.get(key, False)
    if not isinstance(value, bool):
        raise Unsupported(f"config.json field {key} is {value!r}, not true/false")
    return value


def _rope_theta(cfg: dict[str, Any]) -> float:
    """The theta of a plain (default, unscaled) RoPE, from either config format:
    transformers 5's ``rope_parameters`` or the older ``rope_theta`` +
    ``rope_scaling``."""
    params = cfg.get("rope_parameters")
    if params is not None:
        if not isinstance(params, dict) or set(params) - {"rope_type", "rope_theta"}:
            raise Unsupported(f"rope_parameters {params!r} is not a plain default RoPE")
        if params.get("rope_type", "default") != "default":
            raise Unsupported(f"rope_type {params.get('rope_type')!r} is not 'default'")
        theta = params.get("rope_theta")
    else:
        if cfg.get("rope_scaling") is not None:
            raise Unsupported(f"rope_scaling {cfg['rope_scaling']!r} is set")
        theta = cfg.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise Unsupported(f"no explicit rope_theta ({theta!r})")
    return theta


def lean_config(cfg: dict[str, Any]) -> LeanConfig:
    """``config.json``'s content as a ``LeanConfig``; ``Unsupported`` when the
    lean model would not be exactly the Hugging Face one."""
    model_type = cfg.get("model_type")
    if model_type not in FAMILIES:
        raise Unsupported(f"model_type {model_type!r} is not one of {', '.join(FAMILIES)}")
    if cfg.get("quantization_config") is not None:
        raise Unsupported("config.json has a quantization_config")
    if "hidden_act" not in cfg or cfg["hidden_act"] != "silu":
        raise Unsupported(f"hidden_act {cfg.get('hidden_act')!r} is not 'silu'")
    if "tie_word_embeddings" not in cfg:
        raise Unsupported("config.json does not say tie_word_embeddings")
    layer_types = cfg.get("layer_types")
    if layer_types is not None and (
        not isinstance(layer_types, list) or any(t != "full_attention" for t in layer_types)
    ):
        raise Unsupported(f"layer_types {layer_types!r} are not all full attention")
    if model_type == "mistral" and ("sliding_window" not in cfg or cfg["sliding_window"]):
        raise Unsupported("mistral without an explicit 'sliding_window': null")
    if model_type == "qwen2" and _flag(cfg, "use_sliding_window"):
        raise Unsupported("qwen2 with use_sliding_window")
    if model_type == "llama" and cfg.get("sliding_window"):
        raise Unsupported("llama with a sliding_window")
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise Unsupported(f"partial_rotary_factor {cfg['partial_rotary_factor']!r}")
    hidden, heads = _int(cfg, "hidden_size"), _int(cfg, "num_attention_heads")
    n_layers = _int(cfg, "num_hidden_layers")
    head_dim = cfg.get("head_dim") or hidden // heads
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise Unsupported(f"head_dim {head_dim!r} is not a positive even integer")
    eps = cfg.get("rms_norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps <= 0:
        raise Unsupported(f"rms_norm_eps {eps!r} is not a positive number")
    if layer_types is not None and len(layer_types) != n_layers:
        raise Unsupported("layer_types does not list every layer")
    if model_type == "llama":
        qkv_bias = o_bias = _flag(cfg, "attention_bias")
        mlp_bias = _flag(cfg, "mlp_bias")
    else:
        qkv_bias, o_bias, mlp_bias = model_type == "qwen2", False, False
    return LeanConfig(
        model_type=model_type,
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size"),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=_int(cfg, "num_key_value_heads"),
        head_dim=head_dim,
        rms_norm_eps=float(eps),
        vocab_size=_int(cfg, "vocab_size"),
        rope_theta=_rope_theta(cfg),
        tie_word_embeddings=_flag(cfg, "tie_word_embeddings"),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        layer_types=["full_attention"] * n_layers,
    )


def expected_tensors(c: LeanConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape ``model.safetensors`` must hold."""
    h, inter, hd = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * hd, c.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (c.vocab_size, h),
        "model.norm.weight": (h,),
    }
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (h,)
        shapes[p + "post_attention_layernorm.weight"] = (h,)
        for name, out in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            shapes[f"{p}self_attn.{name}.weight"] = (out, h)
            if c.qkv_bias:
                shapes[f"{p}self_attn.{name}.bias"] = (out,)
        shapes[p + "self_attn.o_proj.weight"] = (h, q)
        if c.o_bias:
            shapes[p + "self_attn.o_proj.bias"] = (h,)
        for name, shape in (
            ("gate_proj", (inter, h)),
            ("up_proj", (inter, h)),
            ("down_proj", (h, inter)),
        ):
            shapes[f"{p}mlp.{name}.weight"] = shape
            if c.mlp_bias:
                shapes[f"{p}mlp.{name}.bias"] = (shape[0],)
    return shapes


def read_header(file: Path) -> tuple[int, dict[str, Any]]:
    """(byte offset of the data section, header) of a safetensors file."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        if size > _MAX_HEADER:
            raise ValueError(f"header of {size} bytes")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError("header is not a JSON object")
    return 8 + size, header


def read_tensors(file: Path, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The float32 tensors ``shapes`` names, as views of one copy-on-write
    mapping of ``file`` (nothing is read until used; the mapping goes when the
    last view does). ``Unsupported`` unless the file holds exactly those
    tensors, float32, in those shapes."""
    import numpy as np
    import torch

    try:
        start, header = read_header(file)
    except (OSError, ValueError, struct.error) as exc:
        raise Unsupported(f"{file.name}: unreadable safetensors header ({exc})") from None
    names = {k for k in header if k != "__metadata__"}
    if names != set(shapes):
        extra, missing = sorted(names - set(shapes)), sorted(set(shapes) - names)
        parts = [f"unexpected {extra[:3]}"] if extra else []
        parts += [f"missing {missing[:3]}"] if missing else []
        raise Unsupported(f"{file.name}: not exactly the expected tensors ({', '.join(parts)})")
    size = file.stat().st_size
    for name, shape in shapes.items():
        entry = header[name]
        if not isinstance(entry, dict) or entry.get("dtype") != "F32":
            raise Unsupported(f"{name} is not float32")
        if tuple(entry.get("shape", ())) != shape:
            raise Unsupported(f"{name} has shape {entry.get('shape')}, expected {list(shape)}")
        begin, end = entry["data_offsets"]
        n = 1
        for d in shape:
            n *= d
        if end - begin != 4 * n or (start + begin) % 4 or start + end > size:
            raise Unsupported(f"{name}: bad data offsets {entry['data_offsets']}")
    data = np.memmap(file, dtype=np.uint8, mode="c")
    tensors = {}
    for name, shape in shapes.items():
        begin, end = header[name]["data_offsets"]
        rows = data[start + begin : start + end].view(np.float32).reshape(shape)
        tensors[name] = torch.from_numpy(rows)
    return tensors


def drop_pages(tensor: Any) -> None:
    """Unmap the whole pages of ``tensor``, a view of ``read_tensors``'
    copy-on-write file mapping that nothing wrote to, from this process: a
    stub that has packed a layer no longer holds the file's pages of it while
    it loads the rest (they count in its resident memory until the mapping
    goes; four engines load at once). A later read would fault them back in
    from the file, unchanged."""
    import mmap

    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
    last = end // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _madvise()(first, last - first, _MADV_DONTNEED)


_MADV_DONTNEED = 4  # Linux


@functools.cache
def _madvise() -> Any:
    """libc's ``madvise`` with its signature (built once, not per projection)."""
    import ctypes

    madvise = ctypes.CDLL(None).madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _modules() -> dict[str, type]:
    """The few torch modules of the lean model (built on first use: torch is
    imported lazily, as everywhere in the engine)."""
    import torch
    from torch import nn

    class RotaryEmbedding(nn.Module):
        """transformers' default RoPE, same operations (see the module docstring)."""

        def __init__(self, dim: int, theta: float) -> None:
            super().__init__()
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            self.attention_scaling = 1.0

        def forward(self, x: Any, position_ids: Any) -> tuple[Any, Any]:
            inv_freq = self.inv_freq.to(device=x.device, dtype=torch.float)
            freqs = position_ids[..., None].float() * inv_freq
            emb = torch.cat((freqs, freqs), dim=-1)
            cos = emb.cos() * self.attention_scaling
            sin = emb.sin() * self.attention_scaling
            return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)

    class Norm(nn.Module):
        """An RMSNorm's weight (``fastpath._rms`` computes it)."""

        def __init__(self, weight: Any, eps: float) -> None:
            super().__init__()
            self.weight = nn.Parameter(weight, requires_grad=False)
            self.variance_epsilon = eps

    class Holder(nn.Module):
        """A named group of submodules (``self_attn``, ``mlp``, a layer)."""

    class Decoder(nn.Module):
        """``model.model``: what ``fastpath.forward_packed`` reads."""

        def __init__(self, embed: Any, layers: list[Any], norm: Any, rotary: Any) -> None:
            super().__init__()
            self.embed_tokens = embed
            self.layers = nn.ModuleList(layers)
            self.norm = norm
            self.rotary_emb = rotary

    class CausalLM(nn.Module):
        """The lean model: a fused decoder and its LM head (runs only through
        ``fastpath``; it has no forward of its own)."""

        def __init__(self, config: LeanConfig, decoder: Any, lm_head: Any) -> None:
            super().__init__()
            self.config = config
            self.model = decoder
            self.lm_head = lm_head

        def get_input_embeddings(self) -> Any:
            return self.model.embed_tokens

        def get_output_embeddings(self) -> Any:
            return self.lm_head

    return {
        "RotaryEmbedding": RotaryEmbedding,
        "Norm": Norm,
        "Holder": Holder,
        "Decoder": Decoder,
        "CausalLM": CausalLM,
    }


_MODULES: dict[str, type] = {}


def _linear(weight: Any, bias: Any = None) -> Any:
    """An ``nn.Linear`` over ``weight`` / ``bias``, built without
    ``reset_parameters`` (no random init to overwrite; on the meta device its
    init alone would import ``torch._dynamo``, ~1.5 CPU-s)."""
    from torch import nn

    linear = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(linear)
    linear.in_features, linear.out_features = int(weight.shape[1]), int(weight.shape[0])
    linear.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias, requires_grad=False)
    else:
        linear.register_parameter("bias", None)
    return linear.eval()


def build(
    config: LeanConfig, tensors: dict[str, Any], finish: Callable[[Any], Any] | None = None
) -> Any:
    """The fused lean model over ``tensors`` (``read_tensors``' views).

    ``finish`` (``loader.pack_linear`` or ``loader.quantize_linear``) turns
    each layer's projections into what the engine runs as soon as each is
    built, and then the stacked q/k/v and gate/up weights are assembled in one
    reused scratch buffer instead of a fresh tensor each (a fresh 330 MB,
    page-faulted in, for SmolLM2-135M: ~0.5 CPU-s of a stub's start). The LM
    head is left a plain ``nn.Linear`` (a tied one shares the embedding's
    parameter) for the caller to pack or quantize with the rest of the model."""
    import torch
    from torch import nn

    if not _MODULES:
        _MODULES.update(_modules())
    m = _MODULES
    eps = config.rms_norm_eps
    scratch: list[Any] = []

    def proj(*prefixes: str) -> Any:
        """The projections ``prefixes`` as one linear (stacked as ``fastpath._stack``
        stacks them), finished."""
        weights = [tensors[p + ".weight"] for p in prefixes]
        biases = [tensors.get(p + ".bias") for p in prefixes]
        if len(weights) == 1:
            weight = weights[0]
        elif finish is None:
            weight = torch.cat(weights)
        else:
            rows, cols = sum(int(w.shape[0]) for w in weights), int(weights[0].shape[1])
            if not scratch or scratch[0].numel() < rows * cols:
                scratch[:] = [torch.empty(rows * cols, dtype=weights[0].dtype)]
            weight = torch.cat(weights, out=scratch[0][: rows * cols].view(rows, cols))
        bias = None
        if any(b is not None for b in biases):
            pairs = zip(weights, biases, strict=True)
            bias = torch.cat([torch.zeros(int(w.shape[0])) if b is None else b for w, b in pairs])
        linear = _linear(weight, bias)
        if finish is None:
            return linear
        done = finish(linear)
        if done is linear:  # not converted: it must not keep the scratch buffer
            linear.weight = nn.Parameter(weight.clone(), requires_grad=False)
        else:  # converted: the file's pages of its weights are read no more
            for w in weights:
                drop_pages(w)
        return done

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        attn, mlp, layer = m["Holder"](), m["Holder"](), m["Holder"]()
        attn.qkv_proj = proj(*(p + f"self_attn.{n}_proj" for n in "qkv"))
        attn.o_proj = proj(p + "self_attn.o_proj")
        mlp.gate_up_proj = proj(p + "mlp.gate_proj", p + "mlp.up_proj")
        mlp.down_proj = proj(p + "mlp.down_proj")
        layer.self_attn, layer.mlp = attn, mlp
        layer.input_layernorm = m["Norm"](tensors[p + "input_layernorm.weight"], eps)
        layer.post_attention_layernorm = m["Norm"](
            tensors[p + "post_attention_layernorm.weight"], eps
        )
        layers.append(layer)
    # given its weight, nn.Embedding skips reset_parameters (see _linear)
    embed = nn.Embedding(
        config.vocab_size, config.hidden_size, _weight=tensors["model.embed_tokens.weight"]
    )
    embed.weight.requires_grad_(False)
    lm_head = _linear(embed.weight if config.tie_word_embeddings else tensors["lm_head.weight"])
    if config.tie_word_embeddings:
        lm_head.weight = embed.weight  # the same parameter, as transformers ties it
    decoder = m["Decoder"](
        embed,
        layers,
        m["Norm"](tensors["model.norm.weight"], eps),
        m["RotaryEmbedding"](config.head_dim, config.rope_theta),
    )
    model = m["CausalLM"](config, decoder, lm_head).eval()
    model._trtspec_fused = True
    return model


def load_lean(hf_dir: Path, finish: Callable[[Any], Any] | None = None) -> tuple[Any, str]:
    """(the lean model, "") for a supported ``hf_dir``, else (None, why not);
    ``finish`` as in ``build``."""
    try:
        raw = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise Unsupported("config.json is not a JSON object")
        config = lean_config(raw)
        file = hf_dir / "model.safetensors"
        if not file.is_file():
            raise Unsupported("no single model.safetensors")
        tensors = read_tensors(file, expected_tensors(config))
    except Unsupported as exc:
        return None, str(exc)
    except (OSError, ValueError) as exc:
        return None, f"unreadable: {exc}"
    return build(config, tensors, finish), ""
