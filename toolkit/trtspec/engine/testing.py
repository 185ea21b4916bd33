"""Random speculative checkpoints in the public formats, and in-process engine builds.

Tests, benchmarks and demos need Medusa heads and EAGLE layers that fit a given
target without downloading anything: ``make_medusa_checkpoint`` writes a
``medusa_lm_head`` folder (random ResBlock heads, optionally seeded from the
target's ``lm_head`` so the heads' top-1 sometimes agrees with the target),
``make_eagle_checkpoint`` an EAGLE-1 folder (Llama-style ``config.json``, ``fc``
and one decoder layer), and ``build_engine`` runs the reference builder in
process with the same flags as ``python -m trtspec.build.reference``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def make_medusa_checkpoint(
    path: str | Path,
    target_dir: str | Path,
    *,
    num_heads: int = 3,
    num_layers: int = 1,
    seed: int = 0,
    from_lm_head: bool = True,
) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    path, target_dir = Path(path), Path(target_dir)
    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((target_dir / "config.json").read_text())
    hidden, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
    gen = torch.Generator().manual_seed(seed)
    lm_head = None
    if from_lm_head:
        weights = load_file(str(target_dir / "model.safetensors"))
        lm_head = weights.get("lm_head.weight", weights.get("model.embed_tokens.weight"))
    state: dict[str, Any] = {}
    for h in range(num_heads):
        for layer in range(num_layers):
            state[f"{h}.{layer}.linear.weight"] = torch.randn(hidden, hidden, generator=gen) * 0.02
            state[f"{h}.{layer}.linear.bias"] = torch.zeros(hidden)
        out = torch.randn(vocab, hidden, generator=gen) * 0.02
        if lm_head is not None:
            out = lm_head.clone() + out
        state[f"{h}.{num_layers}.weight"] = out
    save_file(state, str(path / "medusa_lm_head.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
                "medusa_num_heads": num_heads,
                "medusa_num_layers": num_layers,
                "hidden_size": hidden,
                "vocab_size": vocab,
                "base_model_name_or_path": str(target_dir),
            },
            indent=2,
        )
    )
    return path


def make_eagle_checkpoint(path: str | Path, target_dir: str | Path, *, seed: int = 0) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    path, target_dir = Path(path), Path(target_dir)
    path.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((target_dir / "config.json").read_text())
    hidden = int(cfg["hidden_size"])
    conf = {
        k: cfg[k]
        for k in (
            "hidden_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "rms_norm_eps",
            "rope_theta",
            "vocab_size",
            "hidden_act",
        )
        if k in cfg
    }
    conf.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1)
    torch.manual_seed(seed)
    layer = LlamaDecoderLayer(LlamaConfig(**conf), layer_idx=0)
    state = {
        f"layers.0.{k}": v.detach().clone()
        for k, v in layer.state_dict().items()
        if not k.startswith("input_layernorm")
    }
    gen = torch.Generator().manual_seed(seed)
    fc = torch.randn(hidden, 2 * hidden, generator=gen) * 0.02
    fc[:, hidden:] += torch.eye(hidden)  # pass the target feature through: drafts partly agree
    state["fc.weight"] = fc
    state["fc.bias"] = torch.zeros(hidden)
    save_file(state, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(conf, indent=2))
    return path


def build_engine(
    model: str | Path,
    output: str | Path,
    mode: str = "none",
    *,
    max_draft_len: int = 0,
    max_batch_size: int = 4,
    max_input_len: int = 512,
    max_seq_len: int = 1024,
    extra: list[str] | None = None,
) -> Path:
    """Build a reference engine in process (same flags as the CLI module)."""
    from trtspec.build.reference import build, parse_args

    argv = [
        "--model",
        str(model),
        "--output",
        str(output),
        "--mode",
        mode,
        "--max-draft-len",
        str(max_draft_len),
        "--max-batch-size",
        str(max_batch_size),
        "--max-input-len",
        str(max_input_len),
        "--max-seq-len",
        str(max_seq_len),
        "--dtype",
        "float32",
        *(extra or []),
    ]
    return build(parse_args(argv))
