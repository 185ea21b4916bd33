"""Loading a reference engine folder's weights: the target model and its heads.

``hf/`` holds a Hugging Face causal-LM folder (float32 safetensors); when the
engine config records ``quantization: int8`` every ``nn.Linear`` is replaced
at load by a dynamically int8-quantized one (``quantize_dynamic``, qint8): a
cheap draft on CPU that agrees with the float model on most tokens. Medusa
heads (``medusa/``) and the EAGLE layer (``eagle/``) are loaded by
``heads.py``. Attention runs through SDPA so custom 4-D tree masks apply.
"""

from __future__ import annotations

import warnings
from typing import Any

from trtspec.engine.config import EngineConfig, EngineError


def quantize_int8(model: Any) -> Any:
    import torch
    from torch import nn

    with warnings.catch_warnings():
        # torch.ao.quantization warns that it moves to torchao; it still works
        # and is the only dependency-free dynamic int8 path in torch itself.
        warnings.simplefilter("ignore", DeprecationWarning)
        from torch.ao.quantization import quantize_dynamic

        return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def load_target(config: EngineConfig) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf = config.hf_dir
    if not (hf / "config.json").is_file():
        raise EngineError(
            f"{hf}: no Hugging Face model folder (hf/config.json) in the engine",
            hint="rebuild the engine with `trtspec build` (backend: reference)",
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(hf), dtype=torch.float32, attn_implementation="sdpa")
    except (OSError, ValueError) as exc:
        raise EngineError(f"{hf}: cannot load the model: {exc}") from None
    model.eval()
    if config.quantization == "int8":
        model = quantize_int8(model)
    return model


def load_heads(config: EngineConfig, model: Any) -> tuple[Any, Any]:
    """(medusa heads or None, EAGLE drafter or None) for the engine's mode."""
    from trtspec.engine.heads import EagleDrafter, build_medusa

    medusa = eagle = None
    if config.mode == "medusa":
        folder = config.path / "medusa"
        if not folder.is_dir():
            raise EngineError(f"{folder}: medusa engine without its medusa/ heads folder")
        medusa = build_medusa(folder, int(model.config.hidden_size),
                              int(model.get_output_embeddings().weight.shape[0]))
    if config.mode == "eagle":
        folder = config.path / "eagle"
        if not folder.is_dir():
            raise EngineError(f"{folder}: eagle engine without its eagle/ folder")
        eagle = EagleDrafter(folder, model)
    return medusa, eagle
