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
        raise SpecError(
            [f"{filename}: not UTF-8 text ({exc.reason})"], "save the spec as UTF-8"
        ) from None
    data, marks, dup_issues = load_yaml(text, filename)
    return parse_spec(data, filename, marks, source_path=path.resolve(), pre_issues=dup_issues)
