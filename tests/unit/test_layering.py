"""The import graph of the ``trtspec`` package, drawn from the source with
``ast``: no import cycles between modules at module level, the plan (pure
data) never reaches into the executor's ``build`` package, what runs inside
tritonserver (``trtspec.runtime``) reaches nothing of the build side, and the
mode catalogue (imported inside tritonserver) needs only the standard library."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "toolkit" / "trtspec"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The modules an import statement loads (a ``from pkg import sub`` names ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        is_pkg = MODULES.get(module, Path()).name == "__init__.py"
        anchor = module.split(".")
        anchor = anchor if is_pkg else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, *([base] if base else [])])
    found = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
    return found or [base]


def imports(module: str, *, top_level_only: bool) -> set[str]:
    """Every module ``module`` imports at run time (``if TYPE_CHECKING:`` blocks
    never run); ``top_level_only`` also skips imports inside functions."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    out: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import | ast.ImportFrom):
                out.update(_targets(module, node))
            elif isinstance(node, ast.If) and _is_type_checking(node):
                visit(node.orelse)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if not top_level_only:
                    visit(node.body)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        visit([c for c in children if isinstance(c, ast.stmt)])
                        for c in children:
                            if isinstance(c, ast.ExceptHandler | ast.match_case):
                                visit(c.body)

    visit(tree.body)
    return out


def graph(*, top_level_only: bool) -> dict[str, set[str]]:
    return {
        m: {t for t in imports(m, top_level_only=top_level_only) if t in MODULES and t != m}
        for m in MODULES
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strongconnect(v)
    return found


def arrows(edges: dict[str, set[str]], source: str, target: str) -> list[str]:
    """Edges from ``source`` (or its submodules) into ``target`` (or its submodules)."""

    def within(name: str, root: str) -> bool:
        return name == root or name.startswith(root + ".")

    return sorted(
        f"{a} -> {b}"
        for a, targets in edges.items()
        if within(a, source)
        for b in targets
        if within(b, target)
    )


def test_the_graph_sees_the_package() -> None:
    # A drawing that found nothing would pass every rule below.
    edges = graph(top_level_only=True)
    assert len(MODULES) > 80
    assert "trtspec.catalogue" in edges["trtspec.plan"]
    assert "trtspec.build.executor" in graph(top_level_only=False)["trtspec.doctor"]


def test_no_import_cycles_between_modules() -> None:
    # Function-level imports count too: a lazy import that closes a circle is
    # still a circle, only a deferred one.
    assert cycles(graph(top_level_only=True)) == []
    assert cycles(graph(top_level_only=False)) == []


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])  # trtspec.build.executor -> trtspec.build


def test_no_import_cycles_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    for source, targets in graph(top_level_only=False).items():
        outside = {_package(t) for t in targets} - {_package(source)}
        edges.setdefault(_package(source), set()).update(outside)
    assert cycles(edges) == []


def test_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(edges) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("trtspec.plan", "trtspec.build"),  # the plan is data; the executor runs it
        ("trtspec.runtime.engine", "trtspec.build"),  # the engine runs inside tritonserver
        ("trtspec.trtllm_argv", "trtspec.build"),
        ("trtspec.catalogue", "trtspec"),
        ("trtspec.bench.decide", "trtspec.bench.summary"),
    ],
)
def test_forbidden_arrows(source: str, target: str) -> None:
    # Every import counts here, function-level ones included.
    found = [a for a in arrows(graph(top_level_only=False), source, target)]
    if source == "trtspec.catalogue":
        found = [a for a in found if not a.endswith("-> trtspec.catalogue")]
    assert found == []


# The build side: what turns a spec into engines and a repository, and
# measures it. Nothing inside tritonserver may reach these.
BUILD_SIDE = (
    "trtspec.spec",
    "trtspec.modes",
    "trtspec.plan",
    "trtspec.build",
    "trtspec.repo",
    "trtspec.serve",
    "trtspec.bench",
    "trtspec.flows",
    "trtspec.deploy",
    "trtspec.rollout",
    "trtspec.cli",
)


def reached(edges: dict[str, set[str]], roots: list[str]) -> set[str]:
    """Every module importing ``roots`` loads (its packages' ``__init__`` too)."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in seen or module not in edges:
            continue
        seen.add(module)
        todo.extend(edges[module])
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
    return seen


def test_the_runtime_reaches_nothing_of_the_build_side() -> None:
    # Transitively, function-level imports included: a stub that loads the
    # router must not load the spec, the plan or the repository generator.
    edges = graph(top_level_only=False)
    runtime = [m for m in MODULES if m.startswith("trtspec.runtime")]
    assert "trtspec.runtime.models.router" in runtime
    assert "trtspec.runtime.engine.triton_model" in runtime
    loaded = reached(edges, runtime)
    assert "trtspec.artifacts.routing" in loaded  # the walk follows imports
    found = sorted(m for m in loaded if any(m == b or m.startswith(b + ".") for b in BUILD_SIDE))
    assert found == []


def test_reached_follows_imports_to_the_build_side() -> None:
    edges = {"a.x": {"b.y"}, "b.y": {"c"}, "a": set(), "b": set(), "c": set(), "d": set()}
    assert reached(edges, ["a.x"]) == {"a", "a.x", "b", "b.y", "c"}


def test_catalogue_imports_only_the_standard_library() -> None:
    names = imports("trtspec.catalogue", top_level_only=False)
    assert names  # it imports something, so the check below means something
    third_party = sorted(n for n in names if n.split(".")[0] not in sys.stdlib_module_names)
    assert third_party == []


def test_no_test_helpers_in_shipped_packages() -> None:
    assert [m for m in MODULES if m.rsplit(".", 1)[-1] in ("testing", "conftest")] == []
