"""The request log on a disk that refuses writes (issue 44): a full disk
left a malformed line in the log. Now a write refused part way is cut back
to its last whole line, a torn tail is cut before the next append, and the
writer says on stderr when it starts and stops dropping lines. Two ways to
refuse a write, neither needing root: a fault-injecting ``os.write`` for
the log's module that behaves as a full file system does (what fits goes,
then ENOSPC), and the kernel itself in a child process under
``RLIMIT_FSIZE`` (a short write at the limit, then EFBIG). A tmpfs of a few
KiB would need ``mount`` (root)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from trtspec.runtime.models import rollout_log
from trtspec.runtime.models.rollout_log import LineWriter, read_lines


def _record(i: int) -> dict[str, Any]:
    return {"request_id": f"req-{i}", "route": "code", "pad": "x" * 150}


def _raw_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` parsed; fails on a half or malformed line."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data[-80:]
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


class _FullDisk:
    """``os`` for rollout_log, whose ``write`` to ``path`` behaves like a
    file system with ``room`` bytes for that file: what fits is written,
    the next write fails with ENOSPC."""

    def __init__(self, path: Path, room: int) -> None:
        self.path = path
        self.room = room
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}") != str(self.path):
            return os.write(fd, data)
        free = self.room - os.fstat(fd).st_size
        if free <= 0:
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return os.write(fd, bytes(data[:free]))


def test_a_full_disk_leaves_only_whole_lines_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "requests.jsonl"
    disk = _FullDisk(path, room=5000)
    monkeypatch.setattr(rollout_log, "os", disk)
    writer = LineWriter(path, max_bytes=10**6)
    for i in range(100):
        writer.write(_record(i))
        if i % 7 == 6:  # batches of several lines: some end part way
            writer.flush()
    writer.flush()
    assert disk.refused > 0
    full = _raw_lines(path)
    assert len(full) == writer.written and writer.written + writer.dropped == 100
    assert writer.written > 10 and writer.dropped > 10, (writer.written, writer.dropped)
    assert [r["request_id"] for r in full] == [f"req-{i}" for i in range(len(full))]
    disk.room = 10**6  # space again
    for i in range(100, 110):
        writer.write(_record(i))
    writer.close()
    lines = _raw_lines(path)
    assert [r["request_id"] for r in lines[-10:]] == [f"req-{i}" for i in range(100, 110)]
    assert len(lines) == writer.written and read_lines(path) == lines
    said = [ln for ln in capsys.readouterr().err.splitlines() if "trtspec request log" in ln]
    assert said[0].startswith(f"trtspec request log: {path}: ")
    assert "lines dropped (No space left on device); lines are dropped and counted" in said[0]
    assert said[1] == (
        f"trtspec request log: {path}: writing again after {writer.dropped} dropped lines"
    )
    assert len(said) == 2  # once when it started, once when it ended


def test_the_kernel_cutting_a_write_at_the_file_size_limit_leaves_whole_lines(
    tmp_path: Path,
) -> None:
    """In a child under RLIMIT_FSIZE the kernel writes what fits under the
    limit and refuses the rest (EFBIG; SIGXFSZ ignored): a real short write."""
    path = tmp_path / "requests.jsonl"
    script = textwrap.dedent(
        f"""
        import json, resource, signal, sys
        from pathlib import Path
        from trtspec.runtime.models.rollout_log import LineWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20000, resource.RLIM_INFINITY))
        writer = LineWriter(Path({str(path)!r}), max_bytes=10**6)
        for i in range(400):
            writer.write({{"request_id": f"req-{{i}}", "pad": "x" * 150}})
            if i % 9 == 8:
                writer.flush()
        writer.close()
        print(json.dumps([writer.written, writer.dropped]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    written, dropped = json.loads(done.stdout)
    lines = _raw_lines(path)
    assert len(lines) == written and written + dropped == 400 and dropped > 0
    assert path.stat().st_size <= 20000
    assert "lines dropped (File too large)" in done.stderr, done.stderr


def test_a_torn_tail_is_cut_before_the_next_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer killed mid-write (or an older trtspec on a full disk) left
    half a line: the next append would have glued a whole line to it."""
    path = tmp_path / "requests.jsonl"
    whole = "".join(json.dumps(_record(i)) + "\n" for i in range(2))
    path.write_text(whole + json.dumps(_record(2))[:40])
    writer = LineWriter(path)
    writer.write(_record(3))
    writer.close()
    assert [r["request_id"] for r in _raw_lines(path)] == ["req-0", "req-1", "req-3"]
    assert "cut a torn last line of 40 bytes" in capsys.readouterr().err
    path.write_text("no newline at all")  # a file of one torn line
    writer = LineWriter(path)
    writer.write(_record(4))
    writer.close()
    assert [r["request_id"] for r in _raw_lines(path)] == ["req-4"]
