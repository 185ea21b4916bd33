"""The backend × flow matrix is decided once: behind the flow seam
(``trtspec.flows``, the flow objects) and the spec (``trtspec.spec``: the
flow's spec face, ``Backend.gpu`` in ``trtspec.vocab``). Drawn from the source
with ``ast``: no module elsewhere compares against a backend or flow name
(``spec.backend.value == "tensorrt_llm"``, ``spec.flow.kind != "llmapi"``,
``spec.backend is Backend.reference``); it asks the object instead
(``spec.backend.gpu``, ``spec.flow.llm_api``, ``flow_for(spec).memory_plan``)."""

from __future__ import annotations

import ast
from pathlib import Path

from trtspec.flows import FLOW_MODULES
from trtspec.vocab import Backend

PACKAGE = Path(__file__).resolve().parents[2] / "toolkit" / "trtspec"
#: where the matrix is decided: the flows, the spec, and the backend names' owner
DECIDERS = ("flows/", "spec/", "vocab.py")
NAMES = {b.value for b in Backend} | set(FLOW_MODULES)
#: comparisons that must stay, each with its reason
ALLOWED = {
    # The reference engine refuses a config.json its build did not mark: the
    # engine file's own format, read inside tritonserver, where trtspec.runtime
    # may import nothing of the spec side.
    ("runtime/engine/config.py", "extra.get('backend') != 'reference'"),
}


def _names_in(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    return set()


def _backend_member(node: ast.expr) -> bool:
    """``Backend.reference``, ``Backend.tensorrt_llm.value``, ..."""
    while isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id == "Backend":
            return True
        node = node.value
    return False


def name_comparisons(source: str) -> list[str]:
    """Every comparison in ``source`` against a ``Backend`` member, or of a
    backend or flow name with an expression about a backend or a flow."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(_backend_member(s) for s in sides):
            found.append(ast.unparse(node))
            continue
        for i, side in enumerate(sides):
            others = [ast.unparse(o) for j, o in enumerate(sides) if j != i]
            if _names_in(side) & NAMES and any("backend" in o or "flow" in o for o in others):
                found.append(ast.unparse(node))
                break
    return found


def test_the_finder_finds_each_way_of_asking() -> None:
    source = """
a = spec.backend.value == "tensorrt_llm"
b = spec.flow.kind != "llmapi"
c = spec.backend is Backend.reference
d = layout.backend in ("reference",)
e = getattr(spec.flow, "kind", "engine") == "llmapi"
f = step.kind == "reference"  # a build step's kind, not a backend
g = info.get("role") == "engine"  # a model's role, not a flow
h = spec.backend.gpu
"""
    assert name_comparisons(source) == [
        "spec.backend.value == 'tensorrt_llm'",
        "spec.flow.kind != 'llmapi'",
        "spec.backend is Backend.reference",
        "layout.backend in ('reference',)",
        "getattr(spec.flow, 'kind', 'engine') == 'llmapi'",
    ]


def test_no_stage_asks_which_backend_or_flow_by_name() -> None:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(DECIDERS):
            continue
        found |= {(rel, c) for c in name_comparisons(path.read_text(encoding="utf-8"))}
    assert len(list(PACKAGE.rglob("*.py"))) > 80  # the walk saw the package
    assert sorted(found - ALLOWED) == [], (
        "ask the spec or the flow object (spec.backend.gpu, spec.flow.llm_api, "
        "spec.flow.builds_engines, flow_for(spec)) instead of comparing names"
    )
    assert sorted(ALLOWED - found) == []  # an allowance no longer needed goes
