"""Property test: mutating the example specs (dropping keys, changing types,
random values, unknown keys, raw text damage) only ever gives a Spec or a
clean SpecError, never another exception."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.fixtures.specs import DEMO_MODEL_SPECS, stub_routes

from trtspec.errors import SpecError
from trtspec.plan import make_plan
from trtspec.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(
    p for p in (ROOT / "build_specs").glob("*.yaml") if p.name not in DEMO_MODEL_SPECS
)
DOCS = [yaml.safe_load(p.read_text()) for p in EXAMPLES]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["llama", "qwen2", "medusa", "eagle", "float16", "none", "baseline", "-1"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _mutate(doc: Any, data: st.DataObject) -> Any:
    doc = copy.deepcopy(doc)
    for _ in range(data.draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["drop", "replace", "add_key", "dup_list_item"]))
        if not path:
            if action == "replace":
                doc = data.draw(values)
            continue
        parent = doc
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        if action == "drop":
            del parent[last]
        elif action == "replace":
            parent[last] = data.draw(values)
        elif action == "add_key" and isinstance(parent[last], dict):
            parent[last][data.draw(st.text(min_size=1, max_size=10))] = data.draw(values)
        elif action == "dup_list_item" and isinstance(parent[last], list) and parent[last]:
            parent[last].append(copy.deepcopy(parent[last][0]))
    return doc


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = stub_routes(tmp_path_factory.mktemp("prop") / "build_specs")
    for p in EXAMPLES:
        shutil.copy(p, folder / p.name)
    return folder


def _check(path: Path) -> None:
    try:
        spec = load_spec(path)
    except SpecError as exc:
        assert exc.issues and all(isinstance(i, str) and i for i in exc.issues)
        return
    make_plan(spec)  # a spec that validates must also plan


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_specs_fail_cleanly(spec_dir: Path, data: st.DataObject) -> None:
    doc = data.draw(st.sampled_from(DOCS))
    mutated = _mutate(doc, data)
    path = spec_dir / "mutated.yaml"
    path.write_text(yaml.safe_dump(mutated, sort_keys=False, allow_unicode=True))
    _check(path)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_damaged_text_fails_cleanly(spec_dir: Path, data: st.DataObject) -> None:
    text = data.draw(st.sampled_from(EXAMPLES)).read_text()
    cut = data.draw(st.integers(0, len(text)))
    junk = data.draw(
        st.sampled_from(
            ["", ":", "- ", "{", "]", "\t", "&a", "*a", "!!python/name:os.system", "\n  x: 1\n"]
        )
    )
    path = spec_dir / "damaged.yaml"
    path.write_text(text[:cut] + junk + text[cut:])
    _check(path)
