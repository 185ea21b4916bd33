"""Importing public and production corpora as trtspec prompt sets: Spec-Bench
and MT-Bench question files (``question_id``, ``category``, ``turns``, optional
``reference``), ShareGPT conversations (``conversations`` of ``from``/``value``)
and OpenAI-messages exports (``messages`` of ``role``/``content``). Each record
becomes one chat item; the records are grouped into one route per category (or
per the user's mapping), optionally sampled N per category with a seed, and
written as ``<route>.jsonl`` plus a ``routes.yaml`` block to paste into a spec,
with ``max_tokens`` and checks suggested per category.

Multi-turn records are kept whole only when every earlier turn has an answer
to put in the assistant's place (MT-Bench/Spec-Bench ``reference`` answers, or
the assistant turns of a ShareGPT/OpenAI conversation); a later turn that
refers to an answer we do not have would ask the model about text it never
wrote, so such records are cut to their first turn and counted as ``cut``.
Errors name the file, the line, the field and the fix."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from trtspec.bench.routes import Message, PromptItem
from trtspec.errors import BenchError

FORMATS = ("spec_bench", "mt_bench", "sharegpt", "openai")
TURNS = ("all", "first")
_ROUTE_NAME = re.compile(r"[^a-z0-9_]+")
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "system": "system",
}
_OPENAI_ROLES = ("system", "user", "assistant")

# Suggested completion length and checks per category (Spec-Bench's 13 and
# MT-Bench's 8 categories). Lengths follow what each task needs to finish on
# a small model without letting long free-form answers dominate a run; the
# checks are the ones whose inputs a corpus record can carry (a reference
# answer becomes a `golden` only for tasks with one right wording).
CATEGORY_DEFAULTS: dict[str, tuple[int, tuple[str, ...]]] = {
    "translation": (128, ()),
    "summarization": (192, ()),
    "qa": (128, ()),
    "math_reasoning": (256, ()),
    "rag": (128, ()),
    "writing": (384, ()),
    "roleplay": (256, ()),
    "reasoning": (256, ()),
    "math": (256, ()),
    "coding": (384, ("python_compile",)),
    "extraction": (192, ()),
    "stem": (256, ()),
    "humanities": (256, ()),
}
DEFAULT_MAX_TOKENS = 256


@dataclass
class Record:
    """One imported conversation, ready to become a prompt-set item."""

    id: str
    category: str
    messages: list[Message]
    cut: bool = False  # later turns dropped for want of earlier answers


class RouteEntry(TypedDict):
    """One route of the ``routes:`` block written for a spec."""

    prompts: str
    max_tokens: int
    checks: NotRequired[list[str]]


@dataclass
class ImportedRoute:
    name: str
    categories: list[str]
    items: list[PromptItem]
    max_tokens: int
    checks: list[str]
    available: int  # records of these categories before sampling
    cut: int  # records cut to their first turn
    path: Path | None = None


@dataclass
class ImportResult:
    source: Path
    format: str
    routes: list[ImportedRoute] = field(default_factory=list)
    routes_yaml: Path | None = None


def _fail(path: Path, line: int, msg: str, hint: str) -> BenchError:
    return BenchError(f"{path}:{line}: {msg}", hint=hint)


def _text(path: Path, line: int, where: str, value: Any) -> str:
    """A message's text: a string, or OpenAI content parts of type text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) for p in value):
        parts = []
        for i, part in enumerate(value):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _fail(
                    path,
                    line,
                    f"{where}[{i}]: only text parts can be imported, got type {part.get('type')!r}",
                    "drop records with images or audio, or convert them to text first",
                )
            parts.append(part["text"])
        return "".join(parts)
    raise _fail(path, line, f"{where}: must be a string", "give each turn's text as a JSON string")


def detect_format(path: Path, first: dict[str, Any], line: int) -> str:
    if "turns" in first:
        return "spec_bench"
    if "conversations" in first:
        return "sharegpt"
    if "messages" in first:
        return "openai"
    raise _fail(
        path,
        line,
        "cannot tell the corpus format: the record has none of 'turns', "
        "'conversations', 'messages'",
        "pass --format " + "|".join(FORMATS),
    )


def _category(path: Path, line: int, rec: dict[str, Any], fallback: str) -> str:
    raw = rec.get("category")
    if raw is None and isinstance(rec.get("metadata"), dict):
        raw = rec["metadata"].get("category")
    if raw is None:
        return fallback
    if not isinstance(raw, str) or not raw.strip():
        raise _fail(path, line, "category: must be a non-empty string", "fix or drop the field")
    return raw


def _question(path: Path, line: int, rec: dict[str, Any], turns: str, fallback: str) -> Record:
    """Spec-Bench / MT-Bench: user turns, reference answers per turn."""
    qturns = rec.get("turns")
    if not isinstance(qturns, list) or not qturns:
        raise _fail(
            path,
            line,
            "turns: must be a non-empty list of the user's messages",
            'e.g. "turns": ["first question", "follow-up"]',
        )
    texts = [_text(path, line, f"turns[{i}]", t) for i, t in enumerate(qturns)]
    refs = rec.get("reference")
    if refs is not None and not isinstance(refs, list):
        raise _fail(
            path, line, "reference: must be a list of answers, one per turn", "fix or drop it"
        )
    refs = [r if isinstance(r, str) else "" for r in (refs or [])]
    messages: list[Message] = [{"role": "user", "content": texts[0]}]
    cut = False
    if turns == "all" and len(texts) > 1:
        if len(refs) >= len(texts) - 1 and all(r.strip() for r in refs[: len(texts) - 1]):
            for answer, follow_up in zip(refs, texts[1:], strict=False):
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": follow_up},
                ]
        else:
            cut = True
    qid = rec.get("question_id", line)
    return Record(str(qid), _category(path, line, rec, fallback), messages, cut)


def _conversation(
    path: Path, line: int, rec: dict[str, Any], *, fmt: str, turns: str, fallback: str
) -> Record:
    """ShareGPT or OpenAI messages: the conversation up to its last user turn."""
    key, role_key, text_key = (
        ("conversations", "from", "value") if fmt == "sharegpt" else ("messages", "role", "content")
    )
    raw = rec.get(key)
    if not isinstance(raw, list) or not raw:
        raise _fail(
            path,
            line,
            f"{key}: must be a non-empty list of {{{role_key!r}, {text_key!r}}}",
            f"check that the file is in the {fmt} format (--format)",
        )
    messages: list[Message] = []
    for i, turn in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict) or role_key not in turn or text_key not in turn:
            raise _fail(
                path,
                line,
                f"{where}: must be an object with {role_key!r} and {text_key!r}",
                f"check that the file is in the {fmt} format (--format)",
            )
        who = turn[role_key]
        role = _SHAREGPT_ROLES.get(who) if fmt == "sharegpt" else who
        if role not in _OPENAI_ROLES:
            allowed = sorted(_SHAREGPT_ROLES) if fmt == "sharegpt" else list(_OPENAI_ROLES)
            raise _fail(
                path,
                line,
                f"{where}.{role_key}: {who!r} is not one of " + ", ".join(allowed),
                "drop tool/function turns before importing",
            )
        messages.append(
            {"role": role, "content": _text(path, line, f"{where}.{text_key}", turn[text_key])}
        )
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()  # the recorded answer is what we ask for again
    if not any(m["role"] == "user" for m in messages):
        raise _fail(
            path, line, f"{key}: has no user turn to answer", "drop records without a user message"
        )
    cut = False
    if turns == "first":
        first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        cut = first_user != len(messages) - 1
        messages = messages[: first_user + 1]
    rid = rec.get("id", rec.get("question_id", line))
    return Record(str(rid), _category(path, line, rec, fallback), messages, cut)


def read_corpus(
    path: Path, fmt: str = "auto", turns: str = "all", default_category: str = "imported"
) -> tuple[str, list[Record]]:
    """Parse a corpus file; returns the format it was read as and its records."""
    if not path.is_file():
        raise BenchError(f"{path}: corpus file not found", hint="check the path")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[: exc.start].count(b"\n") + 1
        raise _fail(path, line, "not UTF-8 text", "re-encode the file as UTF-8") from None
    records: list[Record] = []
    for n, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _fail(
                path,
                n,
                f"invalid JSON ({exc.msg} at column {exc.colno})",
                "a corpus is JSON Lines: one JSON object per line",
            ) from None
        if not isinstance(rec, dict):
            raise _fail(
                path, n, f"expected a JSON object, got {type(rec).__name__}", "one object per line"
            )
        if fmt == "auto":
            fmt = detect_format(path, rec, n)
        if fmt in ("spec_bench", "mt_bench"):
            records.append(_question(path, n, rec, turns, default_category))
        else:
            records.append(
                _conversation(path, n, rec, fmt=fmt, turns=turns, fallback=default_category)
            )
    if not records:
        raise BenchError(f"{path}: corpus is empty", hint="a corpus needs at least one record")
    return fmt, records


def route_name(category: str) -> str:
    """A spec route name for a category: lower case, [a-z0-9_]."""
    name = _ROUTE_NAME.sub("_", category.strip().lower()).strip("_")
    return name or "imported"


def parse_mapping(pairs: Iterable[str]) -> dict[str, str]:
    """``--map CATEGORY=ROUTE`` options as a dict (several categories may
    share a route)."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        category, sep, route = pair.partition("=")
        if not sep or not category.strip() or not route.strip():
            raise BenchError(
                f"--map {pair!r}: expected CATEGORY=ROUTE", hint="e.g. --map math_reasoning=math"
            )
        if route_name(route) != route.strip():
            raise BenchError(
                f"--map {pair!r}: route name {route.strip()!r} may hold only a-z, 0-9 and _",
                hint=f"use {route_name(route)!r}",
            )
        mapping[category.strip()] = route.strip()
    return mapping


def group_routes(
    records: list[Record],
    *,
    mapping: dict[str, str] | None = None,
    only: list[str] | None = None,
    per_category: int | None = None,
    seed: int = 0,
) -> list[ImportedRoute]:
    """Records grouped into routes, sampled ``per_category`` per category
    (seeded, file order kept among the chosen), in order of first appearance."""
    mapping = mapping or {}
    by_category: dict[str, list[Record]] = {}
    for rec in records:
        by_category.setdefault(rec.category, []).append(rec)
    if only:
        unknown = [c for c in only if c not in by_category]
        if unknown:
            raise BenchError(
                f"--only: no records of categor{'y' if len(unknown) == 1 else 'ies'} "
                + ", ".join(repr(c) for c in unknown),
                hint="categories in this corpus: " + ", ".join(sorted(by_category)),
            )
        by_category = {c: by_category[c] for c in only}
    unmapped = [c for c in mapping if c not in by_category]
    if unmapped:
        raise BenchError(
            "--map: no records of categor"
            + ("y " if len(unmapped) == 1 else "ies ")
            + ", ".join(repr(c) for c in unmapped),
            hint="categories in this corpus: " + ", ".join(sorted(by_category)),
        )
    rng = random.Random(seed)
    routes: dict[str, ImportedRoute] = {}
    for category, recs in by_category.items():
        chosen = recs
        if per_category is not None and per_category < len(recs):
            picked = sorted(rng.sample(range(len(recs)), per_category))
            chosen = [recs[i] for i in picked]
        name = mapping.get(category, route_name(category))
        max_tokens, checks = CATEGORY_DEFAULTS.get(route_name(category), (DEFAULT_MAX_TOKENS, ()))
        route = routes.get(name)
        if route is None:
            route = routes[name] = ImportedRoute(name, [], [], max_tokens, list(checks), 0, 0)
        else:  # several categories in one route: the longer length, every check
            route.max_tokens = max(route.max_tokens, max_tokens)
            route.checks += [c for c in checks if c not in route.checks]
        route.categories.append(category)
        route.available += len(recs)
        for rec in chosen:
            route.cut += rec.cut
            route.items.append({"id": f"{route_name(category)}-{rec.id}", "messages": rec.messages})
    return list(routes.values())


def routes_block(
    routes: list[ImportedRoute], out_dir: Path, spec_dir: Path | None = None
) -> dict[str, RouteEntry]:
    """The ``routes:`` mapping for a spec in ``spec_dir`` (default: the folder
    holding ``out_dir``), prompt paths relative to it as a spec resolves them."""
    import os

    base = Path(spec_dir) if spec_dir is not None else out_dir.parent
    folder = Path(os.path.relpath(out_dir.resolve(), base.resolve()))
    block: dict[str, RouteEntry] = {}
    for route in routes:
        entry: RouteEntry = {
            "prompts": (folder / f"{route.name}.jsonl").as_posix(),
            "max_tokens": route.max_tokens,
        }
        if route.checks:
            entry["checks"] = list(route.checks)
        block[route.name] = entry
    return block


def write_routes(
    result: ImportResult,
    out_dir: Path,
    *,
    overwrite: bool = False,
    spec_dir: Path | None = None,
) -> None:
    """Write each route's prompt set and ``routes.yaml`` atomically; refuses
    to replace existing files unless ``overwrite``."""
    import yaml

    from trtspec.fsutil import atomic_write_text

    targets = [out_dir / f"{r.name}.jsonl" for r in result.routes] + [out_dir / "routes.yaml"]
    existing = [p for p in targets if p.exists()]
    if existing and not overwrite:
        raise BenchError(
            f"{existing[0]}: already exists"
            + (f" (and {len(existing) - 1} more)" if len(existing) > 1 else ""),
            hint="choose another --out folder or pass --force to replace them",
        )
    for route, target in zip(result.routes, targets, strict=False):
        text = "".join(json.dumps(item, ensure_ascii=False) + "\n" for item in route.items)
        atomic_write_text(target, text)
        route.path = target
    header = (
        f"# Imported by `trtspec routes import` from {result.source.name} ({result.format}).\n"
        f"# Paste under `routes:` in a spec in {spec_dir or out_dir.parent}; max_tokens and\n"
        "# checks are suggestions per category.\n"
    )
    block = routes_block(result.routes, out_dir, spec_dir)
    atomic_write_text(targets[-1], header + yaml.safe_dump({"routes": block}, sort_keys=False))
    result.routes_yaml = targets[-1]


def import_corpus(
    path: Path,
    out_dir: Path,
    *,
    fmt: str = "auto",
    turns: str = "all",
    mapping: dict[str, str] | None = None,
    only: list[str] | None = None,
    per_category: int | None = None,
    seed: int = 0,
    default_category: str = "imported",
    overwrite: bool = False,
    spec_dir: Path | None = None,
) -> ImportResult:
    """Read ``path``, group and sample it, write the prompt sets to ``out_dir``."""
    fmt, records = read_corpus(path, fmt, turns, default_category)
    routes = group_routes(records, mapping=mapping, only=only, per_category=per_category, seed=seed)
    result = ImportResult(path, fmt, routes)
    write_routes(result, out_dir, overwrite=overwrite, spec_dir=spec_dir)
    return result
