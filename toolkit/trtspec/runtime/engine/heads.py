"""Medusa heads and the EAGLE-1 draft layer, loaded from their public checkpoint formats.

Medusa (``medusa_lm_head``): K heads, each ``num_layers`` ResBlocks
(``x + SiLU(Linear(x))``) then a bias-free Linear to the vocabulary; keys
``{head}.{layer}.linear.weight|bias`` and ``{head}.{num_layers}.weight``, with a
``config.json`` holding ``medusa_num_heads`` / ``medusa_num_layers``. Head ``i``
reads the target's final hidden state at position t and proposes the token at
t + 2 + i. EAGLE-1: one Llama decoder layer fed ``fc([embed(token_{t+1});
feature_t])`` (``fc``: 2·hidden → hidden), whose output goes through the
target's ``lm_head``; ``config.json`` is Llama-style. This module owns loading
those files and the torch modules that run them; drafting policy lives in
``decode.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.runtime.engine.config import EngineError


def _load_state_dict(folder: Path, what: str) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if files:
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(folder.glob("*.bin")) + sorted(folder.glob("*.pt"))
    if bins:
        state = {}
        for f in bins:
            state.update(torch.load(str(f), map_location="cpu", weights_only=True))
        return state
    raise EngineError(
        f"{folder}: no {what} weights (*.safetensors, *.bin or *.pt) found",
        hint=f"point the variant's checkpoint at a folder holding {what} weights",
    )


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise EngineError(f"{path}: missing (the checkpoint folder needs a config.json)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"{path}: unreadable: {exc}") from None
    if not isinstance(data, dict):
        raise EngineError(f"{path}: expected a JSON object")
    return data


def medusa_shape(folder: Path) -> tuple[int, int]:
    """(num_heads, num_layers) from a Medusa checkpoint's config.json."""
    cfg = _read_json(folder / "config.json")
    try:
        return int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
    except KeyError:
        raise EngineError(
            f"{folder / 'config.json'}: field medusa_num_heads is missing",
            hint="a Medusa checkpoint's config.json names medusa_num_heads and medusa_num_layers",
        ) from None


def build_medusa(folder: Path, hidden_size: int, vocab_size: int) -> Any:
    """The Medusa heads as one ``nn.Module`` (``forward(h) -> [K, ..., vocab]``)."""
    import torch
    from torch import nn

    num_heads, num_layers = medusa_shape(folder)
    state = _load_state_dict(folder, "Medusa head")
    # Some exports prefix keys with "medusa_head." — strip any such prefix.
    state = {k.split("medusa_head.", 1)[-1]: v for k, v in state.items()}

    class ResBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(hidden_size, hidden_size)
            self.act = nn.SiLU()

        def forward(self, x: Any) -> Any:
            return x + self.act(self.linear(x))

    class MedusaHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = nn.ModuleList(
                nn.Sequential(
                    *[ResBlock() for _ in range(num_layers)],
                    nn.Linear(hidden_size, vocab_size, bias=False),
                )
                for _ in range(num_heads)
            )

        def forward(self, h: Any) -> Any:
            return torch.stack([head(h) for head in self.heads])

    module = MedusaHeads()
    mapped = {f"heads.{k}": v for k, v in state.items()}
    expected = set(module.state_dict())
    missing = sorted(expected - set(mapped))
    if missing:
        raise EngineError(
            f"{folder}: Medusa checkpoint lacks {len(missing)} tensors, e.g. "
            f"{missing[0].removeprefix('heads.')!r} (config says {num_heads} heads × "
            f"{num_layers} layers, hidden {hidden_size}, vocab {vocab_size})",
        )
    try:
        module.load_state_dict({k: mapped[k] for k in expected})
    except RuntimeError as exc:
        raise EngineError(f"{folder}: Medusa weights do not fit the target: {exc}") from None
    return module.eval()


class EagleDrafter:
    """EAGLE-1's draft network: fc + one Llama decoder layer, target's lm_head."""

    def __init__(self, folder: Path, target: Any) -> None:
        import torch
        from torch import nn
        from transformers import LlamaConfig, LlamaModel

        cfg = _read_json(folder / "config.json")
        state = _load_state_dict(folder, "EAGLE")
        state = {k.removeprefix("model."): v for k, v in state.items()}
        hidden = int(target.config.hidden_size)
        fc_w = state.get("fc.weight")
        if fc_w is None or tuple(fc_w.shape) != (hidden, 2 * hidden):
            raise EngineError(
                f"{folder}: EAGLE checkpoint needs fc.weight of shape [{hidden}, {2 * hidden}]"
                f" (got {None if fc_w is None else list(fc_w.shape)})"
            )
        cfg = {k: v for k, v in cfg.items() if k not in ("architectures", "auto_map")}
        cfg.update(
            num_hidden_layers=1,
            vocab_size=1,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
            hidden_size=hidden,
            tie_word_embeddings=False,
        )
        lconf = LlamaConfig(**cfg)
        lconf._attn_implementation = "sdpa"
        self.layer_model = LlamaModel(lconf).eval()
        self.layer_model.norm = nn.Identity()
        layer_state = {k: v for k, v in state.items() if k.startswith("layers.0.")}
        if "layers.0.input_layernorm.weight" not in layer_state:
            # EAGLE-1 skips the first layer's input norm (the fc output is fed raw).
            self.layer_model.layers[0].input_layernorm = nn.Identity()
        missing, _ = self.layer_model.load_state_dict(layer_state, strict=False)
        missing = [m for m in missing if not m.startswith("embed_tokens")]
        if missing:
            raise EngineError(f"{folder}: EAGLE checkpoint lacks {missing[0]!r}")
        self.fc = nn.Linear(2 * hidden, hidden, bias="fc.bias" in state)
        with torch.no_grad():
            self.fc.weight.copy_(fc_w)
            if "fc.bias" in state:
                self.fc.bias.copy_(state["fc.bias"])
        from trtspec.runtime.engine.kv_reuse import cache_kwarg

        self._cache_kw = cache_kwarg(self.layer_model)
        self.embed = target.get_input_embeddings()
        self.lm_head = target.get_output_embeddings()

    def forward(
        self, tokens: Any, features: Any, positions: Any, cache: Any, mask: Any = None
    ) -> tuple[Any, Any]:
        """Run pairs (token_{i+1}, feature_i) at ``positions``; returns (hidden, logits).

        ``mask`` is an optional additive 4-D attention mask (tree drafting)."""
        import torch

        x = self.fc(torch.cat([self.embed(tokens), features], dim=-1))
        extra = {} if mask is None else {"attention_mask": mask}
        out = self.layer_model(
            inputs_embeds=x,
            position_ids=positions,
            use_cache=True,
            **{self._cache_kw: cache},
            **extra,
        )
        h = out.last_hidden_state
        return h, self.lm_head(h)
