"""The LLM-API field tables and the check every generated LLM-argument file
passes before anything runs.

``data/llm_args_<line>.json`` holds, per supported TensorRT-LLM release line,
the fields of ``tensorrt_llm/llmapi/llm_args.py`` that a config file may
carry: the top-level ``TorchLlmArgs`` keys, ``kv_cache_config`` and the
``speculative_config`` union (base fields plus each ``decoding_type``'s own),
with types, defaults, aliases and whether the PyTorch backend takes the
decoding type. Each table names the source it was read from (repository,
path, commit or index id, and how its version is known). TensorRT-LLM
rejects unknown top-level keys (``extra='forbid'``) and, in the pinned
lines, unknown nested keys too (``StrictBaseModel``), but only when the
server starts; :func:`validate_llm_args` says the same before any step,
naming the file, the dotted field and the fix.
"""

from __future__ import annotations

import difflib
import json
from functools import cache
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("data")  # llm_args_<line>.json

#: Pinned TensorRT-LLM version -> its table's release line (``data/llm_args_<line>.json``).
PINNED: dict[str, str] = {"1.2.1": "1.2", "1.3.0rc20": "1.3"}


@cache
def table(version: str) -> dict[str, Any]:
    """The field table for a pinned version (``KeyError`` for an unpinned one)."""
    line = PINNED[version]
    return json.loads((DATA / f"llm_args_{line}.json").read_text(encoding="utf-8"))


def decoding_types(version: str) -> dict[str, dict[str, Any]]:
    return table(version)["speculative_config"]["decoding_types"]


def _fields_of(version: str, decoding_type: str) -> dict[str, Any]:
    spec = table(version)["speculative_config"]
    entry = spec["decoding_types"][decoding_type]
    fields = dict(spec["base"])
    if "inherits" in entry:
        fields.update(spec["decoding_types"][entry["inherits"]]["fields"])
    fields.update(entry["fields"])
    return fields


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "str": (str,),
    "dict": (dict,),
    "list": (list,),
}


def _type_problem(value: Any, kind: str) -> str | None:
    if kind == "any":
        return None
    allowed = kind.split("|")
    if value is None:
        return None if "null" in allowed else f"must not be null (type {kind})"
    for name in allowed:
        types = _PY_TYPES.get(name)
        if types is None:
            continue
        # bool is an int in Python; TensorRT-LLM's pydantic refuses true for an int field
        if isinstance(value, bool) and name in ("int", "float"):
            continue
        if isinstance(value, types):
            return None
    return f"must be {kind.replace('|', ' or ')}, got {type(value).__name__} {value!r}"


def _check_fields(
    doc: dict[str, Any], fields: dict[str, Any], where: str, out: list[tuple[str, str]]
) -> None:
    aliases = {a: name for name, f in fields.items() for a in f.get("aliases", [])}
    for key, value in doc.items():
        path = f"{where}.{key}" if where else key
        name = aliases.get(key, key)
        field = fields.get(name)
        if field is None:
            close = difflib.get_close_matches(key, [*fields, *aliases], n=1)
            fix = f"did you mean {close[0]!r}?" if close else "remove it"
            out.append((path, f"unknown field; {fix}"))
            continue
        problem = _type_problem(value, field.get("type", "any"))
        if problem is None and isinstance(value, int | float) and not isinstance(value, bool):
            if "ge" in field and value < field["ge"]:
                problem = f"must be >= {field['ge']}, got {value}"
            elif "le" in field and value > field["le"]:
                problem = f"must be <= {field['le']}, got {value}"
        if problem is None and value is not None and value not in field.get("choices", [value]):
            problem = f"must be one of {', '.join(map(str, field['choices']))}, got {value!r}"
        if problem is not None:
            out.append((path, problem))
    for name, field in fields.items():
        if field.get("required") and name not in doc:
            out.append((f"{where}.{name}" if where else name, "is required"))


def field_problems(doc: dict[str, Any], version: str) -> list[tuple[str, str]]:
    """(dotted field, problem) for every field of an LLM-argument document that
    TensorRT-LLM ``version`` would refuse; empty when the document is clean."""
    t = table(version)
    out: list[tuple[str, str]] = []
    top = {k: v for k, v in doc.items() if k != "triton_config"}
    _check_fields(top, t["top_level"], "", out)
    kv = doc.get("kv_cache_config")
    if isinstance(kv, dict):
        _check_fields(kv, t["kv_cache_config"], "kv_cache_config", out)
    sc = doc.get("speculative_config")
    if isinstance(sc, dict):
        kinds = decoding_types(version)
        dt = sc.get("decoding_type")
        if dt not in kinds:
            close = difflib.get_close_matches(str(dt), list(kinds), n=1)
            fix = f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(kinds)}"
            out.append(
                (
                    "speculative_config.decoding_type",
                    f"{dt!r} is not a decoding type of TensorRT-LLM {version}; {fix}",
                )
            )
        else:
            if not kinds[dt]["pytorch"]:
                out.append(
                    (
                        "speculative_config.decoding_type",
                        f"{dt!r} is not supported by the PyTorch backend of TensorRT-LLM "
                        f"{version} (TensorRT engine flow only)",
                    )
                )
            _check_fields(sc, _fields_of(version, dt), "speculative_config", out)
    return out


def validate_llm_args(doc: dict[str, Any], version: str, file: str) -> list[str]:
    """Each problem as ``file: field: problem (TensorRT-LLM version; fix)``."""
    return [
        f"{file}: {path}: {problem} (llm_args.py of TensorRT-LLM {version})"
        for path, problem in field_problems(doc, version)
    ]
