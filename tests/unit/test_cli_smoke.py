"""Options and scripts no other test reaches: ``trtspec --version`` (the
installed distribution's version) and ``--help`` of every script under
benchmarks/ (each parses its arguments before importing anything heavy, and
exits 0 with its usage line)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec import __version__
from trtspec.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))


def test_version_option() -> None:
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.stdout == f"trtspec, version {__version__}\n"
    assert __version__ == version("trtspec")


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_script_help(script: str) -> None:
    # every script found (a new one is covered without a new line here)
    res = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: {script} [-h]"), res.stdout
    assert res.stderr == ""
