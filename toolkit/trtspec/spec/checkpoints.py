"""What a local checkpoint folder says about itself, for the rules that must
hold before a GPU loads it: whether a target carries MTP layers, and whether
an EAGLE checkpoint is an EAGLE-3 head or an EAGLE-1/2 one. Reads
``config.json`` and the headers of ``*.safetensors`` (the 8-byte length and
the JSON that follows it; no tensor data, no torch). Stdlib only; None
wherever the folder does not say (not local, no file, unreadable).

The facts, from TensorRT-LLM's PyTorch model code:

- MTP: the DeepSeek-V3 family's checkpoints declare their MTP layers as
  ``num_nextn_predict_layers`` in ``config.json``; TensorRT-LLM's MTP drafter
  runs those layers (``MTPDecodingConfig``: "num_nextn_predict_layers"
  deprecated in favour of ``max_draft_len`` at 1.3, the layers still come from
  the checkpoint). A checkpoint without them has nothing to draft with.
- EAGLE-3: ``Eagle3DraftModel`` builds ``fc`` as a Linear from
  ``hidden_size_in × num_capture_layers`` to ``hidden_size``, three captured
  target layers by default (tensorrt_llm/_torch/models/modeling_speculative.py,
  nearest stored commit 00679c66; the default capture set
  ``{1, num_layers//2-1, num_layers-4}`` of ``eagle3_layers_to_capture`` in
  llm_args.py). An EAGLE-1/2 checkpoint's ``fc`` takes the token embedding and
  one hidden state, ``2 × hidden``: it does not load as an EAGLE-3 head.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

#: The most header bytes read from one safetensors file (headers are small).
MAX_HEADER = 64 * 1024 * 1024


def read_config(folder: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def tensor_shapes(folder: Path, wanted: set[str]) -> dict[str, list[int]]:
    """name -> shape for the ``wanted`` tensors found in the folder's
    safetensors headers."""
    out: dict[str, list[int]] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        try:
            with open(file, "rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                if size > MAX_HEADER:
                    continue
                header = json.loads(fh.read(size))
        except (OSError, ValueError, struct.error):
            continue
        for name, entry in header.items():
            if name in wanted and isinstance(entry, dict) and "shape" in entry:
                out[name] = [int(d) for d in entry["shape"]]
    return out


def mtp_layers(folder: Path) -> int | None:
    """The checkpoint's MTP layers (``num_nextn_predict_layers``; 0 = none),
    None without a readable config.json."""
    config = read_config(folder)
    if config is None:
        return None
    try:
        return int(config.get("num_nextn_predict_layers") or 0)
    except (TypeError, ValueError):
        return 0


def eagle_generation(folder: Path) -> tuple[str | None, str]:
    """("eagle3" | "eagle1" | None, why) for an EAGLE checkpoint folder, from
    its ``fc.weight`` shape against its hidden size (and its architecture
    name where the weights say nothing)."""
    config = read_config(folder)
    if config is None:
        return None, "no readable config.json"
    hidden = config.get("target_hidden_size") or config.get("hidden_size")
    shapes = tensor_shapes(folder, {"fc.weight", "model.fc.weight"})
    fc = shapes.get("fc.weight") or shapes.get("model.fc.weight")
    if isinstance(hidden, int) and fc and len(fc) == 2 and hidden > 0:
        ratio, rest = divmod(fc[1], hidden)
        if rest == 0 and ratio == 2:
            return "eagle1", f"fc.weight is {fc}: 2 × hidden ({hidden}), embedding + one state"
        if rest == 0 and ratio >= 3:
            return "eagle3", f"fc.weight is {fc}: {ratio} × hidden ({hidden})"
    names = [str(a) for a in config.get("architectures") or []]
    if any("eagle3" in a.lower() for a in names):
        return "eagle3", f"architectures {names}"
    return None, "no fc.weight shape or EAGLE-3 architecture name to tell by"
