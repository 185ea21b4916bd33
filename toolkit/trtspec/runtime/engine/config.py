"""The engine folder's ``config.json``: the TensorRT-LLM-shaped schema both backends share.

A reference engine folder carries the same ``{version, pretrained_config,
build_config}`` document ``trtllm-build`` writes, with the integer
``speculative_decoding_mode`` of TRT-LLM's enum, plus a ``"trtspec"`` object
holding what only the reference backend needs (quantization, the lookahead
(W, N, G), the Medusa/EAGLE choice trees). This module owns that schema
(the mode names, integers and lookahead rules come from ``trtspec.catalogue``):
building the document at build time and reading it back (with clear errors) at load time.
It imports neither torch nor transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.catalogue import ENGINE_MODE_BY_INT, ENGINE_MODES, lookahead_problem
from trtspec.errors import TrtspecError

#: Engine modes the reference backend can run (catalogue order).
REFERENCE_MODES = tuple(m.name for m in ENGINE_MODES.values() if m.reference)

#: The version string written into reference engine configs (the pinned TRT-LLM).
ENGINE_VERSION = "1.1.0"


class EngineError(TrtspecError):
    """An engine folder is missing, unreadable or inconsistent."""


def default_max_num_tokens(max_batch_size: int, max_draft_len: int, max_input_len: int) -> int:
    """A reference engine's step budget: a full batch of draft trees, or one whole prompt."""
    return max(max_batch_size * (max_draft_len + 1), max_input_len)


def check_lookahead(window: int, ngram: int, verification: int) -> None:
    """Raise ``EngineError`` unless (W, N, G) is legal under TRT-LLM's rules."""
    problem = lookahead_problem(window, ngram, verification)
    if problem is not None:
        raise EngineError(
            f"Invalid lookahead config (W={window}, N={ngram}, G={verification}): {problem}"
        )


@dataclass
class EngineConfig:
    """What the reference engine needs from ``config.json``."""

    path: Path
    mode: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int
    vocab_size: int
    quantization: str = "none"
    lookahead: tuple[int, int, int] | None = None
    medusa_choices: list[list[int]] | None = None
    eagle_choices: list[list[int]] | None = None
    num_medusa_heads: int = 0
    num_eagle_layers: int = 0
    tokens_per_block: int = 32
    raw: dict[str, Any] = field(default_factory=dict)

    @property
    def hf_dir(self) -> Path:
        return self.path / "hf"

    @property
    def tokenizer_dir(self) -> Path:
        return self.path / "tokenizer"


def build_config_document(
    *,
    mode: str,
    architecture: str,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_draft_len: int,
    dtype: str = "float32",
    quantization: str = "none",
    lookahead: tuple[int, int, int] | None = None,
    medusa_choices: list[list[int]] | None = None,
    num_medusa_heads: int = 0,
    eagle_choices: list[list[int]] | None = None,
    num_eagle_layers: int = 0,
    eagle_net_config: dict[str, Any] | None = None,
    tokens_per_block: int = 32,
) -> dict[str, Any]:
    """The TRT-LLM-shaped ``config.json`` document for a reference engine."""
    if mode not in REFERENCE_MODES:
        raise EngineError(f"unknown speculative decoding mode {mode!r}")
    pretrained: dict[str, Any] = {
        "architecture": architecture,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_hidden_layers": num_layers,
        "max_draft_len": max_draft_len,
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
        "quantization": {
            "quant_algo": "W8A8_DYNAMIC_INT8" if quantization == "int8" else None,
            "kv_cache_quant_algo": None,
        },
    }
    if mode == "medusa":
        pretrained["num_medusa_heads"] = num_medusa_heads
    if mode == "eagle":
        pretrained["num_eagle_layers"] = num_eagle_layers
        pretrained["eagle_net_config"] = eagle_net_config or {}
    # TRT-LLM grows max_seq_len by max_draft_len for speculative engines.
    effective_seq_len = max_seq_len + (max_draft_len if mode != "none" else 0)
    return {
        "version": ENGINE_VERSION,
        "pretrained_config": pretrained,
        "build_config": {
            "max_batch_size": max_batch_size,
            "max_input_len": max_input_len,
            "max_seq_len": effective_seq_len,
            "max_beam_width": 1,
            "max_num_tokens": default_max_num_tokens(max_batch_size, max_draft_len, max_input_len),
            "max_draft_len": max_draft_len,
            "speculative_decoding_mode": ENGINE_MODES[mode].trtllm_int,
            "kv_cache_type": "paged",
            "plugin_config": {
                "tokens_per_block": tokens_per_block,
                "use_paged_context_fmha": True,
                "gemm_plugin": None,
            },
        },
        "trtspec": {
            "backend": "reference",
            "quantization": quantization,
            "lookahead": list(lookahead) if lookahead else None,
            "medusa_choices": medusa_choices,
            "eagle_choices": eagle_choices,
        },
    }


def _need(doc: dict[str, Any], section: str, key: str, path: Path) -> Any:
    try:
        return doc[section][key]
    except (KeyError, TypeError):
        raise EngineError(
            f"{path}: field {section}.{key} is missing",
            hint="rebuild the engine with `trtspec build`",
        ) from None


def read_engine_config(engine_dir: str | Path) -> EngineConfig:
    """Read a reference engine folder's ``config.json``; ``EngineError`` if unusable."""
    engine_dir = Path(engine_dir)
    cfg_path = engine_dir / "config.json"
    if not cfg_path.is_file():
        raise EngineError(
            f"{cfg_path}: no engine config.json found",
            hint="point gpt_model_path at an engine folder built by `trtspec build`",
        )
    try:
        doc = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineError(f"{cfg_path}: unreadable engine config: {exc}") from None
    extra = doc.get("trtspec") if isinstance(doc, dict) else None
    if not isinstance(extra, dict) or extra.get("backend") != "reference":
        raise EngineError(
            f'{cfg_path}: not a reference engine (no "trtspec": {{"backend": "reference"}})',
            hint="TensorRT-LLM engines (rank0.engine) are served by the tensorrtllm backend",
        )
    mode_int = _need(doc, "build_config", "speculative_decoding_mode", cfg_path)
    known = ENGINE_MODE_BY_INT.get(int(mode_int))
    mode = known.name if known else None
    if mode not in REFERENCE_MODES:
        raise EngineError(
            f"{cfg_path}: build_config.speculative_decoding_mode {mode_int} is not supported "
            f"by the reference backend (supported: "
            f"{', '.join(str(ENGINE_MODES[m].trtllm_int) for m in REFERENCE_MODES)})"
        )
    assert mode is not None
    max_draft_len = int(_need(doc, "build_config", "max_draft_len", cfg_path))
    max_seq_len = int(_need(doc, "build_config", "max_seq_len", cfg_path))
    la = extra.get("lookahead")
    plugin = doc["build_config"].get("plugin_config") or {}
    pre = doc.get("pretrained_config") or {}
    return EngineConfig(
        path=engine_dir,
        mode=mode,
        max_batch_size=int(_need(doc, "build_config", "max_batch_size", cfg_path)),
        max_input_len=int(_need(doc, "build_config", "max_input_len", cfg_path)),
        max_seq_len=max_seq_len,
        max_draft_len=max_draft_len,
        vocab_size=int(_need(doc, "pretrained_config", "vocab_size", cfg_path)),
        quantization=str(extra.get("quantization") or "none"),
        lookahead=tuple(int(x) for x in la) if la else None,  # type: ignore[arg-type]
        medusa_choices=extra.get("medusa_choices"),
        eagle_choices=extra.get("eagle_choices"),
        num_medusa_heads=int(pre.get("num_medusa_heads") or 0),
        num_eagle_layers=int(pre.get("num_eagle_layers") or 0),
        tokens_per_block=int(plugin.get("tokens_per_block") or 32),
        raw=doc,
    )


def parse_choices(text: str | list[Any] | None) -> list[list[int]] | None:
    """Parse choices given as JSON (``[[0],[0,0]]``) or TRT-LLM's ``{0}, {0, 0}`` form."""
    if text is None:
        return None
    if isinstance(text, list):
        data: Any = text
    else:
        s = text.strip()
        if not s or s.startswith("${"):
            return None
        if "{" in s:
            s = "[" + s.replace("{", "[").replace("}", "]") + "]"
        try:
            data = json.loads(s)
        except json.JSONDecodeError:
            raise EngineError(
                f"cannot parse choices {text!r}: expected JSON like [[0], [0, 0], [1]]"
            ) from None
    if not isinstance(data, list) or not all(
        isinstance(c, list) and c and all(isinstance(i, int) and i >= 0 for i in c) for c in data
    ):
        raise EngineError(
            f"invalid choices {text!r}: expected a list of non-empty lists of "
            "non-negative integers, e.g. [[0], [0, 0], [1]]"
        )
    return [list(c) for c in data]
