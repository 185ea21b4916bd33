"""YAML loading that keeps line/column marks for every key and value and
rejects duplicate keys, so validation errors can point at ``file:line:col``.

It is also bounded: a spec is a few hundred values, so the composer refuses a
document whose aliases would expand to more than ``MAX_NODES`` nodes (a
342-byte "billion laughs" expands to 10⁹), an alias inside the node it names
(a cycle our walk would follow forever) and nesting deeper than ``MAX_DEPTH``
(PyYAML composes recursively and would hit Python's recursion limit). Sizes
are counted as nodes are composed — an alias costs the size of the node it
names, never a copy — so the check itself takes memory and time in proportion
to the text, not to the expansion."""

from __future__ import annotations

from typing import Any

import yaml

from trtspec.errors import SpecError

Path_ = tuple[str | int, ...]

# 50 times the largest example spec (vicuna-7b.yaml: about 200 nodes).
MAX_NODES = 10_000
MAX_DEPTH = 64
_LIMIT_HINT = (
    "a spec needs neither deep nesting nor aliases that multiply; write the values out "
    "(or anchor only small blocks)"
)


class _Limit(Exception):
    """A bound of this loader was hit at ``mark``."""

    def __init__(self, mark: Any, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = f"{mark.line + 1}:{mark.column + 1}" if mark is not None else "1:1"


class _MarkedLoader(yaml.SafeLoader):
    """SafeLoader whose nodes we walk ourselves to keep marks and catch duplicates,
    with the size, cycle and depth bounds of the module docstring."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: list[str] = []
        self._sizes: dict[int, int] = {}  # id(node) -> nodes it expands to

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _Limit(
                    event.start_mark,
                    f"the alias *{event.anchor} refers to the node that contains it "
                    "(a recursive alias)",
                )
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _Limit(event.start_mark, f"nesting deeper than {MAX_DEPTH} levels")
        anchor = getattr(event, "anchor", None)
        self._depth += 1
        if anchor:
            self._open_anchors.append(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor:
                self._open_anchors.pop()
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        size = 1 + sum(self._sizes.get(id(child), 1) for child in children)
        self._sizes[id(node)] = size
        if size > MAX_NODES:
            raise _Limit(
                event.start_mark,
                f"this value expands to more than {MAX_NODES:,} nodes through its aliases "
                "(an alias bomb)",
            )
        return node


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
    try:
        loader = _MarkedLoader(text)
    except yaml.reader.ReaderError as exc:  # a character YAML refuses, before any token
        line, col = _line_col(text, exc.position)
        raise SpecError([f"{filename}:{line}:{col}: {_reader_problem(exc)}"], _CHAR_HINT) from None
    try:
        node = loader.get_single_node()
        data = None if node is None else _walk_node(loader, node, (), marks, raw)
    except _Limit as exc:
        raise SpecError(
            [f"{filename}:{exc.where}: invalid YAML: {exc.problem}"], _LIMIT_HINT
        ) from None
    except RecursionError:
        # Not reachable through compose_node's bounds; kept so that no YAML
        # ever ends in "unexpected RecursionError".
        line, col = loader.line + 1, loader.column + 1
        raise SpecError(
            [f"{filename}:{line}:{col}: invalid YAML: nested too deeply"],
            _LIMIT_HINT,
        ) from None
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text, exc.position)
        raise SpecError([f"{filename}:{line}:{col}: {_reader_problem(exc)}"], _CHAR_HINT) from None
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


_CHAR_HINT = "remove the character (a spec is plain text; write it as an escape in a quoted string)"


def _line_col(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def _reader_problem(exc: yaml.reader.ReaderError) -> str:
    char = exc.character
    code = ord(char) if isinstance(char, str) else int(char)
    return f"invalid YAML: control character U+{code:04X} is not allowed in a spec"


def format_path(path: Path_) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"
