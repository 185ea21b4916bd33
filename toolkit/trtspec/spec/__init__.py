"""The build spec: schema (``schema``), YAML with marks (``yamlmarks``) and
validation (``checks``); this module owns loading.

``load_spec(path)`` parses YAML with a loader that rejects duplicate keys and
remembers where each key and value sits, validates the schema (unknown keys
rejected with one "did you mean" suggestion, enums for choices, ranges on
numbers), then runs the cross-field rules TensorRT-LLM enforces late (beam
width, lookahead/EAGLE/Medusa limits, draft/target vocabulary, version range,
missing local paths). Every problem is collected and raised together as one
``SpecError`` whose lines read ``file:line:col: field.path: problem; fix``.
Soft problems (a chat-template mismatch) land in ``Spec.warnings``.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trtspec.errors import SpecError
from trtspec.modes.draft_model import DraftModel
from trtspec.spec.checks import _check, _Issues, _pydantic_issues, _short, has_chat_template
from trtspec.spec.schema import (
    DEFAULT_EXAMPLES_DIR,
    DEFAULT_TRITON_IMAGE,
    DEFAULT_TRTLLM_VERSION,
    MODES,
    Backend,
    Bench,
    Decision,
    DraftModelVariant,
    DType,
    EagleVariant,
    Family,
    KvCache,
    LookaheadVariant,
    MedusaVariant,
    ModelLocation,
    NgramVariant,
    Quantization,
    Rollout,
    Route,
    Spec,
    Stack,
    Target,
    Variant,
    locate,
)
from trtspec.spec.yamlmarks import Path_, format_path, load_yaml
from trtspec.versions import parse_version

__all__ = [
    "DEFAULT_EXAMPLES_DIR",
    "DEFAULT_TRITON_IMAGE",
    "DEFAULT_TRTLLM_VERSION",
    "MODES",
    "Backend",
    "Bench",
    "DType",
    "Decision",
    "DraftModel",
    "DraftModelVariant",
    "EagleVariant",
    "Family",
    "KvCache",
    "LookaheadVariant",
    "MedusaVariant",
    "ModelLocation",
    "NgramVariant",
    "Quantization",
    "Rollout",
    "Route",
    "Spec",
    "Stack",
    "Target",
    "Variant",
    "format_path",
    "has_chat_template",
    "load_spec",
    "load_yaml",
    "locate",
    "parse_spec",
    "parse_version",
]


def parse_spec(
    data: Any,
    filename: str,
    marks: dict[Path_, tuple[int, int]] | None = None,
    source_path: Path | None = None,
    pre_issues: list[str] | None = None,
) -> Spec:
    """Validate already-parsed YAML data; raise SpecError with every problem."""
    issues = _Issues(filename, marks or {})
    issues.lines.extend(pre_issues or [])
    if not isinstance(data, dict):
        issues.add(
            (),
            f"the spec must be a mapping with keys name, target, variants...; got {_short(data)}",
        )
        raise SpecError(issues.in_file_order(), "see build_specs/ for examples")
    _text_problems(data, (), issues)
    if issues.lines:  # paths with NUL or 100 kB names cannot be checked further
        raise SpecError(
            issues.in_file_order(), "fix the fields named above; `trtspec validate` rechecks"
        )
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        _pydantic_issues(exc, data, issues)
        raise SpecError(
            issues.in_file_order(), "fix the fields named above; `trtspec validate` rechecks"
        ) from None
    spec._source_path = source_path
    warnings = _check(spec, issues)
    if issues.lines:
        raise SpecError(
            issues.in_file_order(), "fix the fields named above; `trtspec validate` rechecks"
        )
    spec._warnings = warnings
    return spec


# Longer than any path the kernel takes (PATH_MAX) and than any name or URL a
# spec needs; past it a path check would fail with ENAMETOOLONG.
MAX_STRING = 4096
# C0 controls and DEL, except tab and newline (legal in a YAML block string).
_CONTROL = {chr(c) for c in range(32) if c not in (9, 10)} | {"\x7f"}


def _text_problems(data: Any, path: tuple[Any, ...], issues: _Issues) -> None:
    """Strings no field can use: control characters (a NUL ends a path at the
    kernel) and strings longer than ``MAX_STRING``; keys as well as values."""

    def check(text: str, where: tuple[Any, ...], key: bool) -> None:
        what = "key" if key else "value"
        bad = next((c for c in text if c in _CONTROL), None)
        if bad is not None:
            issues.add(
                where,
                f"the {what} contains the control character U+{ord(bad):04X}; remove it",
                key=key,
            )
        elif len(text) > MAX_STRING:
            issues.add(
                where,
                f"the {what} is {len(text):,} characters long; at most {MAX_STRING:,} are allowed",
                key=key,
            )

    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str):
                check(k, (*path, k), True)
            _text_problems(v, (*path, k), issues)
    elif isinstance(data, list):
        for i, v in enumerate(data):
            _text_problems(v, (*path, i), issues)
    elif isinstance(data, str):
        check(data, path, False)


def load_spec(path: str | Path) -> Spec:
    """Load, validate and resolve a build spec file."""
    path = Path(path)
    filename = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError([f"{filename}: spec file not found"], "check the path") from None
    except IsADirectoryError:
        raise SpecError(
            [f"{filename}: is a folder, not a spec file"], "pass a .yaml file"
        ) from None
    except UnicodeDecodeError as exc:
        raw = path.read_bytes()
        line = raw[: exc.start].count(b"\n") + 1
        col = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(
            [
                f"{filename}:{line}:{col}: not UTF-8 text (byte 0x{raw[exc.start]:02X}: "
                f"{exc.reason})"
            ],
            "save the spec as UTF-8",
        ) from None
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise  # full, read-only, denied: the CLI's os_error says those
        raise SpecError(
            [f"{filename[:200]}…: the file name is too long ({len(filename):,} characters)"],
            "check the path",
        ) from None
    except ValueError:
        raise SpecError(
            [f"{filename[:200]!r}: not a usable file name (it contains a NUL character)"]
        ) from None
    data, marks, dup_issues = load_yaml(text, filename)
    return parse_spec(data, filename, marks, source_path=path.resolve(), pre_issues=dup_issues)
