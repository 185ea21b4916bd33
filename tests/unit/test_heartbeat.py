"""trtspec.heartbeat: what a stub writes and what the watchdog reads of it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from trtspec import heartbeat


def test_no_folder_no_heartbeat(monkeypatch) -> None:
    monkeypatch.delenv(heartbeat.DIR_ENV, raising=False)
    assert heartbeat.start() is False


def test_a_beating_process_stays_young_and_a_stopped_one_ages(tmp_path: Path) -> None:
    # a fresh interpreter: start() runs once per process
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from trtspec import heartbeat\n"
            "assert heartbeat.start(sys.argv[1], interval_s=0.05)\n"
            "assert heartbeat.start(sys.argv[1], interval_s=0.05)  # once per process\n"
            "print('up', flush=True)\n"
            "time.sleep(600)\n",
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        time.sleep(0.5)
        age = heartbeat.age(tmp_path, child.pid)
        assert age is not None and age < 0.4, age
        first = (tmp_path / str(child.pid)).stat().st_mtime
        time.sleep(0.3)
        assert (tmp_path / str(child.pid)).stat().st_mtime > first  # it keeps beating
        assert oct((tmp_path / str(child.pid)).stat().st_mode & 0o777) == "0o600"
        child.kill()
        child.wait()
        time.sleep(0.5)
        assert heartbeat.age(tmp_path, child.pid) >= 0.4
        assert heartbeat.age(tmp_path, child.pid, now=time.time() + 60) > 59
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    assert heartbeat.age(tmp_path, 999_999_999) is None  # never beat
    heartbeat.forget(tmp_path, child.pid)
    assert heartbeat.age(tmp_path, child.pid) is None
    (tmp_path / "123").touch()
    heartbeat.clear(tmp_path)
    assert os.listdir(tmp_path) == []


def test_an_unwritable_folder_means_no_heartbeat(tmp_path: Path) -> None:
    missing = tmp_path / "not-there"
    assert heartbeat.start(missing) is False
    assert not missing.exists()
