"""benchmarks/sabotage.py's own mechanics, on a scratch tree: a bug is in
place while its tests run and gone after, byte for byte with the file's
mtime, on an exception or Ctrl-C too; a run killed outright is undone by the
next; an entry that no longer applies, or that aims at tests, is refused;
catches are counted apart from tests that fail anyway; one real pytest run
on a same-size patch (the stale-``__pycache__`` case). And every entry of
the real list still applies to this checkout and names tests that exist."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.fixtures.benchmarks import benchmark_module

sabotage = benchmark_module("sabotage")

MODULE = "def limit(a, b):\n    return a < b\n"


def _tree(tmp_path: Path) -> Path:
    target = tmp_path / "toolkit" / "pkg" / "mod.py"
    target.parent.mkdir(parents=True)
    target.write_text(MODULE)
    os.utime(target, ns=(1_600_000_000_000_000_000,) * 2)
    return tmp_path


def _entry(old: str = "a < b", new: str = "a <= b", path: str = "toolkit/pkg/mod.py"):
    return sabotage.Sabotage("lt", path, old, new, ("tests/test_mod.py",), "a < for <=")


def test_planted_while_inside_and_restored_with_its_mtime_after(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    target = root / "toolkit/pkg/mod.py"
    before = (target.read_bytes(), target.stat().st_mtime_ns)
    with sabotage.planted(root, _entry()) as path:
        assert path == target
        assert target.read_text() == "def limit(a, b):\n    return a <= b\n"
        assert target.stat().st_mtime_ns // 10**9 >= before[1] // 10**9 + 2
        assert sorted(p.suffix for p in (root / ".sabotage").iterdir()) == [".json", ".orig"]
    assert (target.read_bytes(), target.stat().st_mtime_ns) == before
    assert list((root / ".sabotage").iterdir()) == []


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, RuntimeError])
def test_restored_when_the_run_is_interrupted(tmp_path: Path, interrupt: type) -> None:
    root = _tree(tmp_path)
    target = root / "toolkit/pkg/mod.py"
    with pytest.raises(interrupt), sabotage.planted(root, _entry()):
        assert "a <= b" in target.read_text()
        raise interrupt()
    assert target.read_text() == MODULE


# A child process that plants the entry, says so, and waits to be signalled.
CHILD = """
import signal, sys, time
sys.path.insert(0, sys.argv[2])
import sabotage
signal.signal(signal.SIGTERM, sabotage.interrupt)  # as main() does
entry = sabotage.Sabotage("lt", "toolkit/pkg/mod.py", "a < b", "a <= b", ("t",), "")
with sabotage.planted(sabotage.Path(sys.argv[1]), entry):
    print("planted", flush=True)
    time.sleep(60)
"""


def _planted_child(root: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(Path(sabotage.__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "planted\n"  # the entry is in place now
    assert "a <= b" in (root / "toolkit/pkg/mod.py").read_text()
    return child


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_a_kill_signal_restores_the_file(tmp_path: Path, sig: int) -> None:
    root = _tree(tmp_path)
    target = root / "toolkit/pkg/mod.py"
    before = target.stat().st_mtime_ns
    child = _planted_child(root)
    child.send_signal(sig)
    child.communicate(timeout=30)
    assert child.returncode != 0
    assert (target.read_text(), target.stat().st_mtime_ns) == (MODULE, before)
    assert list((root / ".sabotage").iterdir()) == []


def test_a_run_killed_outright_is_undone_by_the_next(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    target = root / "toolkit/pkg/mod.py"
    before = target.stat().st_mtime_ns
    child = _planted_child(root)
    child.kill()  # SIGKILL: no finally runs
    child.communicate(timeout=30)
    assert "a <= b" in target.read_text()
    assert sabotage.recover(root) == ["toolkit/pkg/mod.py"]
    assert (target.read_text(), target.stat().st_mtime_ns) == (MODULE, before)
    assert sabotage.recover(root) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (_entry(old="a > b"), "occurs 0 times (needs exactly 1)"),
        (_entry(old="a"), "occurs 2 times (needs exactly 1)"),
        (_entry(path="tests/test_mod.py"), "not product code under toolkit/"),
        (_entry(path="toolkit/../tests/test_mod.py"), "not product code under toolkit/"),
    ],
)
def test_an_entry_that_does_not_apply_is_refused_untouched(
    tmp_path: Path, entry, message: str
) -> None:
    root = _tree(tmp_path)
    (root / "tests").mkdir()
    (root / "tests/test_mod.py").write_text("a < b\n")
    with (
        pytest.raises(sabotage.SabotageError, match=re.escape(message)),
        sabotage.planted(root, entry),
    ):
        raise AssertionError("planted")
    assert (root / "toolkit/pkg/mod.py").read_text() == MODULE
    assert (root / "tests/test_mod.py").read_text() == "a < b\n"


def test_catches_are_counted_apart_from_tests_failing_anyway(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    seen: list[tuple[str, ...]] = []

    def runner(_root: Path, tests: Sequence[str]) -> tuple[int, list[str]]:
        seen.append(tuple(tests))
        planted = "a <= b" in (root / "toolkit/pkg/mod.py").read_text()
        return 3, ["t::always", *(["t::edge"] if planted else [])]

    caught = _entry()
    missed = sabotage.Sabotage("gt", "toolkit/pkg/mod.py", "a < b", "a < b ", ("t",), "none")
    gone = _entry(old="nowhere")
    broken, results = sabotage.run(root, [caught, missed, gone], runner)
    assert broken == ["t::always"]
    assert [(r.caught_by, r.error is None) for r in results] == [
        (["t::edge"], True),
        ([], True),
        ([], False),
    ]
    assert seen == [("tests/test_mod.py", "t"), ("tests/test_mod.py",), ("t",)]
    text = sabotage.render(broken, results)
    assert "caught by 1 of 3 tests:\n    t::edge" in text
    assert "NOT CAUGHT by any of 3 tests" in text
    assert "DOES NOT APPLY" in text
    assert (root / "toolkit/pkg/mod.py").read_text() == MODULE


def test_a_real_pytest_run_sees_a_same_size_patch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The clean run compiles mod.py into __pycache__; a patch of the same
    size must still be what the next run imports, and so must the restored
    file after it."""
    root = _tree(tmp_path)
    (root / "toolkit/pkg/mod.py").write_text("def limit(a, b):\n    return a < b  \n")
    (root / "tests").mkdir()
    (root / "tests/test_mod.py").write_text(
        "import sys\nfrom pathlib import Path\n"
        "sys.path.insert(0, str(Path(__file__).parents[1] / 'toolkit' / 'pkg'))\n"
        "from mod import limit\n\n\n"
        "def test_edge():\n    assert not limit(1, 1)\n\n\n"
        "def test_below():\n    assert limit(0, 1)\n"
    )
    entry = sabotage.Sabotage(
        "le", "toolkit/pkg/mod.py", "a < b  ", "a <= b ", ("tests/test_mod.py",), "same size"
    )
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)  # the clean run writes its .pyc
    broken, (result,) = sabotage.run(root, [entry], sabotage.run_pytest)
    assert list((root / "toolkit/pkg/__pycache__").glob("mod.*.pyc"))
    assert broken == []
    assert (result.error, result.ran, result.caught_by) == (
        None,
        2,
        ["tests/test_mod.py::test_edge"],
    )
    # restored: the planted file's .pyc (same size) is not what runs next
    assert sabotage.run_pytest(root, ["tests/test_mod.py"]) == (2, [])


def test_every_listed_sabotage_applies_here_and_names_real_tests() -> None:
    root = Path(sabotage.ROOT)
    assert {s.name for s in sabotage.SABOTAGES} >= {
        "summary-pairs-by-position",
        "decide-on-the-point-estimate",
        "canary-bucket-inclusive",
    }
    for s in sabotage.SABOTAGES:
        assert Path(s.path).parts[0] == "toolkit", s.name
        found = (root / s.path).read_text(encoding="utf-8").count(s.old)
        assert found == 1, (
            f"benchmarks/sabotage.py entry {s.name!r}: its piece of {s.path} occurs {found} "
            "times; the code moved or changed, so update the entry's path or old/new text"
        )
        assert s.old != s.new and s.tests, s.name
        for test in s.tests:
            file, _, name = test.partition("::")
            assert (root / file).is_file(), (s.name, test)
            if name:
                assert f"def {name.split('[')[0]}(" in (root / file).read_text(), (s.name, test)
