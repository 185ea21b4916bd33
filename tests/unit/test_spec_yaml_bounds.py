"""The spec loader is bounded (issue 10, D3): an alias bomb, a recursive alias
and very deep nesting each end in one ``file:line:col`` error, found while
composing, with memory and work in proportion to the text (counted here, not
timed)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.errors import SpecError
from trtspec.spec import load_spec, yamlmarks

# The classic "billion laughs": 9 levels of 9 aliases, 342 bytes, 9⁹ strings.
BOMB = (
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
    "h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]\n"
    "i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]\n"
)
HINT = (
    "a spec needs neither deep nesting nor aliases that multiply; write the values out "
    "(or anchor only small blocks)"
)


def _error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return err.value


def test_billion_laughs_fails_fast_with_file_and_line(tmp_path: Path, monkeypatch) -> None:
    assert len(BOMB.encode()) == 342
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    composed = []
    original = yamlmarks._MarkedLoader.compose_node

    def counting(self, parent, index):
        composed.append(1)
        return original(self, parent, index)

    monkeypatch.setattr(yamlmarks._MarkedLoader, "compose_node", counting)
    tracemalloc.start()
    try:
        error = _error(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Level e (9⁵ nodes) is the first past the budget; it sits on line 5.
    assert error.issues == [
        f"{path}:5:4: invalid YAML: this value expands to more than 10,000 nodes through its "
        "aliases (an alias bomb)"
    ]
    assert error.hint == HINT
    assert len(composed) < 60  # the nodes written in the text, never their expansion
    assert peak < 2_000_000


def test_merge_keys_count_what_they_merge(tmp_path: Path) -> None:
    # a, b, c: 1,639 nodes in all; merging c seven times is 11,473.
    lines = ["a: &a {" + ", ".join(f"k{i}: {i}" for i in range(9)) + "}"]
    for p, c in zip("ab", "bc", strict=True):
        lines.append(f"{c}: &{c} {{" + ", ".join(f"k{i}: *{p}" for i in range(9)) + "}")
    lines.append("top: {<<: [" + ", ".join(["*c"] * 7) + "]}")
    path = tmp_path / "merge.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert _error(path).issues == [
        f"{path}:4:11: invalid YAML: this value expands to more than 10,000 nodes through its "
        "aliases (an alias bomb)"
    ]


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        (
            "a: &a [1, *a]\n",
            "1:11",
            "the alias *a refers to the node that contains it (a recursive alias)",
        ),
        (
            "a: &a {x: 1}\nb: &b {<<: [*a], y: *b}\n",
            "2:21",
            "the alias *b refers to the node that contains it (a recursive alias)",
        ),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "1:67", "nesting deeper than 64 levels"),
        (
            "".join("  " * i + f"k{i}:\n" for i in range(200)),
            "64:127",
            "nesting deeper than 64 levels",
        ),
    ],
    ids=["recursive-sequence", "recursive-merge", "deep-flow", "deep-block"],
)
def test_recursion_and_depth_are_spec_errors(
    tmp_path: Path, text: str, where: str, problem: str
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    error = _error(path)
    assert error.issues == [f"{path}:{where}: invalid YAML: {problem}"]
    assert error.hint == HINT
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: {path}:{where}: invalid YAML: {problem}\nHint: {HINT}\n"


def test_anchors_within_the_budget_still_work(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text(
        "name: t\n"
        "target: &t {model: org/target, family: llama}\n"
        "variants:\n"
        "  - {name: ngram, <<: &v {mode: ngram, max_draft_len: 4}}\n"
        "  - {<<: *v, name: ngram2}\n"
    )
    spec = load_spec(path)
    assert [v.name for v in spec.variants] == ["ngram", "ngram2"]
