"""One style: the tree is ruff-clean and ruff-formatted (the same checks as `make lint`).

Runs the real ruff from the environment, so a change that skips `ruff format`
fails `make test`, not only `make lint`.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ["toolkit", "tests", "benchmarks"]


def _ruff() -> str:
    exe = Path(sys.executable).with_name("ruff")
    if exe.exists():
        return str(exe)
    found = shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: run `make setup` (it is in the dev extra)")
    return found


@pytest.mark.parametrize("args", [["format", "--check"], ["check"]], ids=["format", "check"])
def test_tree_is_ruff_clean(args: list[str]) -> None:
    proc = subprocess.run(
        [_ruff(), *args, *TREES], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, (
        f"`ruff {' '.join(args)}` found problems; run `ruff format` / `ruff check --fix`:\n"
        + proc.stdout[-3000:]
        + proc.stderr[-1000:]
    )


def test_format_check_fails_on_unformatted_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("x = [1,\n  2]\n")
    proc = subprocess.run(
        [_ruff(), "format", "--check", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
