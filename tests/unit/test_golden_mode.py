"""Golden update mode cannot pass: it writes the new golden files, then fails
with "review the diff" (tests/fixtures/golden.py), for single files and trees."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.fixtures.golden import ENV, check_golden_file, check_golden_tree


def test_update_mode_writes_the_file_and_fails(tmp_path: Path, monkeypatch) -> None:
    golden = tmp_path / "plan" / "x.json"
    golden.parent.mkdir()
    golden.write_text("old\n")
    monkeypatch.setenv(ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"x\.json rewritten; review the diff"):
        check_golden_file(golden, "new\n")
    assert golden.read_text() == "new\n"
    # even when nothing changed, a run with the flag set does not pass
    with pytest.raises(pytest.fail.Exception, match="unchanged, rewritten anyway; review"):
        check_golden_file(golden, "new\n")


def test_update_mode_replaces_the_tree_and_fails(tmp_path: Path, monkeypatch) -> None:
    golden = tmp_path / "repo"
    (golden / "stale").mkdir(parents=True)
    (golden / "stale" / "config.pbtxt").write_text("gone")
    monkeypatch.setenv(ENV, "yes")
    with pytest.raises(pytest.fail.Exception, match="repo rewritten; review the diff"):
        check_golden_tree(golden, {"a/config.pbtxt": "A", "b.json": "B"})
    assert sorted(str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file()) == [
        "a/config.pbtxt",
        "b.json",
    ]


def test_compare_mode_only_reads(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    golden = tmp_path / "g.json"
    golden.write_text("stored\n")
    assert check_golden_file(golden, "different\n") == "stored\n"
    assert golden.read_text() == "stored\n"
    with pytest.raises(AssertionError, match=r"missing .*nope\.json; run with"):
        check_golden_file(tmp_path / "nope.json", "x")
    monkeypatch.setenv(ENV, "0")
    assert check_golden_tree(tmp_path, {}) == {"g.json": "stored\n"}
