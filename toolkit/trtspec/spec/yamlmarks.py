"""YAML loading that keeps line/column marks for every key and value and
rejects duplicate keys, so validation errors can point at ``file:line:col``."""

from __future__ import annotations

from typing import Any

import yaml

from trtspec.errors import SpecError

Path_ = tuple[str | int, ...]


class _MarkedLoader(yaml.SafeLoader):
    """SafeLoader whose nodes we walk ourselves to keep marks and catch duplicates."""


def _walk_node(
    loader: _MarkedLoader,
    node: yaml.Node,
    path: Path_,
    marks: dict[Path_, tuple[int, int]],
    issues: list[tuple[Path_, str]],
) -> Any:
    marks.setdefault(path, (node.start_mark.line + 1, node.start_mark.column + 1))
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if not isinstance(key, str | int | float | bool) or key is None:
                key = str(key)
            kpath = (*path, key) if isinstance(key, str | int) else (*path, str(key))
            if key in out:
                first = marks.get(("__key__", *kpath))
                where = f" (first at line {first[0]})" if first else ""
                marks[("__dup__", *kpath)] = (
                    knode.start_mark.line + 1,
                    knode.start_mark.column + 1,
                )
                issues.append((("__dup__", *kpath), f"duplicate key {key!r}{where}; keep only one"))
                continue
            marks[("__key__", *kpath)] = (knode.start_mark.line + 1, knode.start_mark.column + 1)
            out[key] = _walk_node(loader, vnode, kpath, marks, issues)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [
            _walk_node(loader, item, (*path, i), marks, issues) for i, item in enumerate(node.value)
        ]
    return loader.construct_object(node, deep=True)


def load_yaml(text: str, filename: str) -> tuple[Any, dict[Path_, tuple[int, int]], list[str]]:
    """Parse YAML keeping marks. Returns (data, marks, formatted duplicate-key issues)."""
    marks: dict[Path_, tuple[int, int]] = {}
    raw: list[tuple[Path_, str]] = []
    loader = _MarkedLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else _walk_node(loader, node, (), marks, raw)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = f"{mark.line + 1}:{mark.column + 1}" if mark else "1:1"
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError(
            [f"{filename}:{pos}: invalid YAML: {problem}"], "fix the YAML syntax at that position"
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"{filename}:1:1: invalid YAML: {exc}"], "fix the YAML syntax") from None
    finally:
        loader.dispose()
    issues = []
    for path, msg in raw:
        line, col = marks[path]
        issues.append(f"{filename}:{line}:{col}: {format_path(path[1:])}: {msg}")
    return data, marks, issues


def format_path(path: Path_) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"
