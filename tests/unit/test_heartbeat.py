"""trtspec.runtime.heartbeat: what a stub writes and what the watchdog reads of it."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trtspec.runtime import health, heartbeat


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
            "from trtspec.runtime import heartbeat\n"
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
    health.clear(tmp_path)  # what a restart does to the folder (trtspec.serve.Server)
    assert os.listdir(tmp_path) == []


def test_an_unwritable_folder_means_no_heartbeat(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    assert heartbeat.start(tmp_path / "a-file" / "beats") is False


class _Live(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_the_liveness_command(tmp_path: Path, capfd) -> None:
    """What the Kubernetes pod's liveness probe runs (trtspec deploy k8s):
    0 while every live stub beats and Triton answers "live"; 1 on a live
    process whose beat is stale, or a live endpoint that fails; files of
    processes that are gone are not judged."""
    folder = tmp_path / "beats"
    assert heartbeat.main([str(folder)]) == 0  # nothing beats (yet): nothing frozen
    folder.mkdir()
    me = folder / str(os.getpid())
    me.touch()
    gone = folder / "999999999"  # no such process: a stub restarted under a new pid
    gone.touch()
    os.utime(gone, (time.time() - 3600, time.time() - 3600))
    assert heartbeat.main([str(folder)]) == 0
    os.utime(me, (time.time() - 30, time.time() - 30))
    assert heartbeat.main([str(folder)]) == 1
    assert (
        f"stub pid {os.getpid()} last beat 30 s ago (over 10 s): frozen" in capfd.readouterr().err
    )
    assert heartbeat.main([str(folder), "--frozen-s", "60"]) == 0
    me.touch()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Live)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v2/health/live"
    try:
        assert heartbeat.main([str(folder), "--live-url", url]) == 0
        _Live.status = 503
        assert heartbeat.main([str(folder), "--live-url", url]) == 1
        assert "503" in capfd.readouterr().err
    finally:
        _Live.status = 200
        server.shutdown()
        server.server_close()
    assert heartbeat.main([str(folder), "--live-url", url]) == 1  # nobody listens
    # as the probe runs it: a fresh interpreter, stdlib and trtspec only
    ok = subprocess.run(
        [sys.executable, "-m", "trtspec.runtime.heartbeat", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
