"""Under CI=1 an unexpected skip fails the run; an allow-listed one stays a
skip; outside CI nothing changes (tests/fixtures/ci_skips.py), checked on a
small suite run by a real pytest in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.ci_skips import EXPECTED

ROOT = Path(__file__).resolve().parents[2]

SUITE = """\
import pytest

def test_runs():
    pass

def test_hidden_area():
    pytest.skip("no tritonserver here: not on PATH")

@pytest.mark.skipif(True, reason="no GPU: nvidia-smi not found")
def test_gpu_only():
    pass
"""


def _pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_small.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "tests.fixtures.ci_skips",
         "-c", os.devnull, "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )  # fmt: skip


def test_an_unexpected_skip_fails_under_ci(tmp_path: Path) -> None:
    res = _pytest(tmp_path, "1")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "1 failed, 1 passed, 1 skipped" in res.stdout, res.stdout
    assert (
        "unexpected skip under CI=1: 'no tritonserver here: not on PATH'. Make it run here, "
        "or add its reason to EXPECTED in tests/fixtures/ci_skips.py" in res.stdout
    ), res.stdout
    assert "FAILED test_small.py::test_hidden_area" in res.stdout
    assert "SKIPPED [1] test_small.py:9: no GPU: nvidia-smi not found" in res.stdout, res.stdout


def test_outside_ci_skips_stay_skips(tmp_path: Path) -> None:
    res = _pytest(tmp_path, "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 passed, 2 skipped" in res.stdout, res.stdout


def test_every_expected_skip_says_why() -> None:
    assert EXPECTED and all(len(why) > 20 for why in EXPECTED.values())
