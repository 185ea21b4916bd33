"""Reading an engine folder back: the TensorRT-LLM ``config.json``
(``{version, pretrained_config, build_config}``, with
``build_config.speculative_decoding_mode`` an integer enum) and, when present,
trtspec's ``trtspec.json`` manifest, against which the folder's files are
verified (``trtspec.integrity``). Used by ``trtspec inspect`` and to put a
summary of each engine into its manifest. Works the same for GPU engines and
reference-backend engines, which share the config layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.artifacts.engine_manifest import MANIFEST
from trtspec.catalogue import ENGINE_MODE_BY_INT
from trtspec.errors import TrtspecError
from trtspec.integrity import require_intact, unverifiable_note

PLUGIN_KEYS = (
    "gpt_attention_plugin",
    "gemm_plugin",
    "context_fmha",
    "use_paged_context_fmha",
    "paged_kv_cache",
    "remove_input_padding",
    "tokens_per_block",
)


def mode_name(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        known = ENGINE_MODE_BY_INT.get(value)
        return known.trtllm_flag if known else f"unknown({value})"
    if isinstance(value, str):  # some writers store the enum's name
        return value.lower()
    return "none" if value is None else f"unknown({value!r})"


def summarize_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields of an engine ``config.json`` that say what the engine can do."""
    pre = config.get("pretrained_config") or {}
    build = config.get("build_config") or {}
    if not isinstance(pre, dict) or not isinstance(build, dict):
        raise ValueError("pretrained_config and build_config must be objects")
    plugins = build.get("plugin_config") or {}
    mapping = pre.get("mapping") or {}
    quant = pre.get("quantization") or {}
    raw_mode = build.get("speculative_decoding_mode", 1)
    summary: dict[str, Any] = {
        "trtllm_version": config.get("version"),
        "architecture": pre.get("architecture"),
        "dtype": pre.get("dtype"),
        "vocab_size": pre.get("vocab_size"),
        "quantization": quant.get("quant_algo") if isinstance(quant, dict) else None,
        "tp_size": mapping.get("tp_size", 1) if isinstance(mapping, dict) else 1,
        "pp_size": mapping.get("pp_size", 1) if isinstance(mapping, dict) else 1,
        "max_batch_size": build.get("max_batch_size"),
        "max_input_len": build.get("max_input_len"),
        "max_seq_len": build.get("max_seq_len"),
        "max_beam_width": build.get("max_beam_width"),
        "max_num_tokens": build.get("max_num_tokens"),
        "max_draft_len": build.get("max_draft_len", pre.get("max_draft_len", 0)),
        "speculative_decoding_mode": raw_mode,
        "speculative_mode_name": mode_name(raw_mode),
        "kv_cache_type": build.get("kv_cache_type"),
        "plugins": {
            k: plugins.get(k) for k in PLUGIN_KEYS if isinstance(plugins, dict) and k in plugins
        },
    }
    for extra in ("num_medusa_heads", "num_eagle_layers", "max_non_leaves_per_layer"):
        if extra in pre:
            summary[extra] = pre[extra]
    if isinstance(config.get("trtspec"), dict):
        summary["trtspec"] = config["trtspec"]
    return summary


def read_engine(folder: str | Path) -> dict[str, Any]:
    """Summary of an engine folder; raises TrtspecError naming what is wrong."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TrtspecError(
            f"{folder}: no such engine folder", "pass a folder under engines/<spec>/"
        )
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise TrtspecError(
            f"{folder} is not an engine folder: config.json is missing",
            "build it with `trtspec build`, or pass the folder trtllm-build wrote",
        )
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise TrtspecError(f"{cfg_path}: not valid JSON ({exc})", "rebuild the engine") from None
    if not isinstance(config, dict):
        raise TrtspecError(f"{cfg_path}: expected a JSON object", "rebuild the engine")
    try:
        summary = summarize_config(config)
    except ValueError as exc:
        raise TrtspecError(f"{cfg_path}: {exc}", "rebuild the engine") from None
    info: dict[str, Any] = {"engine_dir": str(folder), **summary}
    info["files"] = sorted(p.name for p in folder.iterdir() if p.is_file())
    info["has_tokenizer"] = (folder / "tokenizer").is_dir()
    manifest_path = folder / MANIFEST
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except ValueError:
            manifest = None
        if isinstance(manifest, dict):
            info["manifest"] = {
                "spec": manifest.get("spec"),
                "spec_hash": manifest.get("spec_hash"),
                "backend": manifest.get("backend"),
                "built_at": manifest.get("built_at"),
                "versions": manifest.get("versions"),
                "steps": [s.get("id") for s in manifest.get("steps", []) if isinstance(s, dict)],
            }
            info["files_check"] = (
                f"ok: {len(manifest['files'])} files match trtspec.json"
                if require_intact(folder, manifest)
                else unverifiable_note(folder)
            )
    return info
