"""The LLM-API field tables and the check every generated LLM-argument file
passes before anything runs (and the CPU stand-in of the llmapi model at
load, as upstream's ``LLM(**args)`` would: so it lives in ``runtime``, which
the spec's checks import too).

``data/llm_args_<line>.json`` holds, per supported TensorRT-LLM release line,
the fields of ``tensorrt_llm/llmapi/llm_args.py`` that a config file may
carry: the top-level ``TorchLlmArgs`` keys, ``kv_cache_config`` and the
``speculative_config`` union (base fields plus each ``decoding_type``'s own),
with types, defaults, aliases and whether the PyTorch backend takes the
decoding type, and the cross-field rules of ``DecodingBaseConfig``'s
validators (:func:`rules`). Each table names the source it was read from
(repository, path, commit or index id, and how its version is known). TensorRT-LLM
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
PINNED: dict[str, str] = {"1.2.1": "1.2", "1.3.0rc22": "1.3"}


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


def rules(version: str) -> dict[str, Any]:
    """The cross-field rules of ``speculative_config`` at ``version`` (the
    table's ``speculative_config.rules``, read from DecodingBaseConfig's
    validators): fields that exclude each other, how ``draft_len_schedule``'s
    keys read (``lower_bound``: the largest key not above the batch size wins;
    ``upper_bound``: the smallest key not below it, none above the largest)
    and which key must carry ``max_draft_len``, and how one-model paths
    (Eagle3, MTP) sample (``allow_advanced_sampling``: greedily unless that
    flag is on; ``automatic``: per request)."""
    return dict(table(version)["speculative_config"]["rules"])


def schedule_draft_len(schedule: dict[int, int], batch: int, keys: str) -> int | None:
    """The draft length ``draft_len_schedule`` gives at ``batch`` requests,
    as the pinned drafter reads it (``keys`` from :func:`rules`); None where
    no key applies (below the smallest key under ``lower_bound``)."""
    ordered = sorted(schedule.items())
    if keys == "upper_bound":
        return next((k_len for key, k_len in ordered if batch <= key), 0)
    fitting = [k_len for key, k_len in ordered if key <= batch]
    return fitting[-1] if fitting else None


def _schedule_keys(value: dict[Any, Any]) -> dict[int, int] | None:
    try:
        return {int(k): int(v) for k, v in value.items()}
    except (TypeError, ValueError):
        return None


def _rule_problems(sc: dict[str, Any], version: str, out: list[tuple[str, str]]) -> None:
    r = rules(version)
    for group in r["exclusive"]:
        present = [name for name in group if sc.get(name) is not None]
        if len(present) > 1:
            out.append(
                (
                    f"speculative_config.{present[1]}",
                    f"{' and '.join(present)} exclude each other at this version; keep one",
                )
            )
    schedule = sc.get("draft_len_schedule")
    if not isinstance(schedule, dict) or not schedule:
        return
    where = "speculative_config.draft_len_schedule"
    parsed = _schedule_keys(schedule)
    if parsed is None:
        out.append((where, "keys (batch sizes) and values (draft lengths) must be integers"))
        return
    if any(k < 1 for k in parsed) or any(v < 0 for v in parsed.values()):
        out.append((where, "batch-size keys must be >= 1 and draft lengths >= 0"))
        return
    rule = r["draft_len_schedule"]
    if rule["must_have_key_1"] and 1 not in parsed:
        out.append((where, "must include batch size 1 (add {1: <max_draft_len>})"))
        return
    top = sc.get("max_draft_len")
    if isinstance(top, int) and not isinstance(top, bool):
        smallest = min(parsed)
        if rule["smallest_key_is_max_draft_len"] and parsed[smallest] != top:
            out.append(
                (
                    where,
                    f"the smallest batch size ({smallest}) must map to max_draft_len ({top}), "
                    f"got {parsed[smallest]}",
                )
            )
        elif any(v > top for v in parsed.values()):
            out.append((where, f"every draft length must be <= max_draft_len ({top})"))


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
            _rule_problems(sc, version, out)
    return out


def validate_llm_args(doc: dict[str, Any], version: str, file: str) -> list[str]:
    """Each problem as ``file: field: problem (TensorRT-LLM version; fix)``."""
    return [
        f"{file}: {path}: {problem} (llm_args.py of TensorRT-LLM {version})"
        for path, problem in field_problems(doc, version)
    ]
