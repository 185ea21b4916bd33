"""The request log with several router processes on one file (Triton's
``instance_group { count: N }``): every line whole and kept once, rotation
by one process at a time, every file within ``max_bytes``, and a writer
that follows a file another writer rotated away; on one stdout pipe, no
line torn (under the lock, and in whole-line writes of at most PIPE_BUF
without it); ``read_lines`` under the writers' lock, so a rotation never
makes it skip a file or fail; and a closed writer refusing lines."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import Choice, load_routing
from trtspec.runtime.models import rollout_log
from trtspec.runtime.models.rollout_live import Live, Tracked
from trtspec.runtime.models.rollout_log import LineWriter, line_chunks, log_files, read_lines

MODULE = Path(rollout_log.__file__)
WRITERS = 3
RECORDS = 1500
MAX_BYTES = 16 * 1024

# One writer process: loads the module from its file (it is stdlib-only; by
# path, so an older copy can be checked the same way), waits for the go file
# so all writers overlap, writes in small bursts so their batches and
# rotations interleave, and reports its counters.
CHILD = """
import importlib.util, json, sys, time
from pathlib import Path
module, path, go, wid = sys.argv[1:5]
spec = importlib.util.spec_from_file_location("rollout_log_child", module)
log = importlib.util.module_from_spec(spec)
spec.loader.exec_module(log)
writer = log.LineWriter(Path(path), max_bytes=int(sys.argv[5]), backups=200)
while not Path(go).exists():
    time.sleep(0.001)
for seq in range(int(sys.argv[6])):
    writer.write({"writer": int(wid), "seq": seq, "pad": "x" * 60})
    if seq % 20 == 0:
        time.sleep(0.001)
writer.close(timeout=30)
print(json.dumps({"written": writer.written, "dropped": writer.dropped}))
"""


def _run_writers(tmp_path: Path) -> tuple[Path, list[dict[str, int]]]:
    path = tmp_path / "requests.jsonl"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, *map(str, (MODULE, path, go, wid, MAX_BYTES, RECORDS))],
            stdout=subprocess.PIPE,
            text=True,
        )
        for wid in range(WRITERS)
    ]
    time.sleep(0.3)  # let every child start and wait
    go.touch()
    counters = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        counters.append(json.loads(out))
    return path, counters


def test_several_processes_on_one_file_keep_every_line_whole_and_once(tmp_path: Path) -> None:
    path, counters = _run_writers(tmp_path)
    assert counters == [{"written": RECORDS, "dropped": 0}] * WRITERS
    files = log_files(path)
    assert len(files) > 10  # rotated many times, by several processes
    torn = [
        line
        for f in files
        for line in f.read_text(encoding="utf-8").splitlines()
        if not line.startswith('{"writer":') or not line.endswith("}")
    ]
    assert torn == []
    records = read_lines(path)
    assert len(records) == WRITERS * RECORDS
    for wid in range(WRITERS):
        seqs = [r["seq"] for r in records if r["writer"] == wid]
        assert seqs == list(range(RECORDS))  # each once, in order across the files
    over = {f.name: f.stat().st_size for f in files if f.stat().st_size > MAX_BYTES}
    assert over == {}


def test_a_writer_follows_a_file_another_writer_rotated_away(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    first = LineWriter(path, max_bytes=1024, backups=5)
    other = LineWriter(path, max_bytes=1024, backups=5)
    first.write({"i": 0})
    first.flush()
    for i in range(1, 40):  # ~40 lines of ~50 bytes: the other rotates the file
        other.write({"i": i, "pad": "y" * 30})
    other.flush()
    first.write({"i": 40})
    first.close()
    other.close()
    assert [r["i"] for r in read_lines(path)] == list(range(41))
    assert json.loads(path.read_text().splitlines()[-1]) == {"i": 40}  # not in a backup
    assert all(f.stat().st_size <= 1024 for f in log_files(path))
    assert (tmp_path / "requests.jsonl.lock").exists()
    assert (tmp_path / "requests.jsonl.lock") not in log_files(path)


def test_without_backups_a_full_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    writer = LineWriter(path, max_bytes=512, backups=0)
    for i in range(100):
        writer.write({"i": i, "pad": "z" * 30})
    writer.close()
    assert log_files(path) == [path]
    got = [r["i"] for r in read_lines(path)]
    assert got and got == list(range(100 - len(got), 100))
    assert path.stat().st_size <= 512


def test_a_line_longer_than_max_bytes_gets_a_file_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    writer = LineWriter(path, max_bytes=256, backups=5)
    writer.write({"i": 0})
    writer.write({"i": 1, "pad": "w" * 600})
    writer.write({"i": 2})
    writer.close()
    per_file = [[json.loads(x)["i"] for x in f.read_text().splitlines()] for f in log_files(path)]
    assert per_file == [[0], [1], [2]]
    assert writer.written == 3 and writer.dropped == 0


# -- to stdout -----------------------------------------------------------------

# One process writing lines to its stdout, a pipe it shares with the others:
# loads the module by path, waits for the go file, queues its lines (the
# writer thread sends them in batches of up to 64 KiB).
STDOUT_CHILD = """
import importlib.util, sys, time
from pathlib import Path
module, go, wid, n, lock = sys.argv[1:6]
spec = importlib.util.spec_from_file_location("rollout_log_child", module)
log = importlib.util.module_from_spec(spec)
spec.loader.exec_module(log)
locked = {"lock": Path(lock)} if lock else {}
writer = log.LineWriter(None, stream=sys.stdout, queue_size=100000, **locked)
while not Path(go).exists():
    time.sleep(0.001)
for seq in range(int(n)):
    writer.write({"writer": int(wid), "seq": seq, "pad": "x" * 200})
writer.close(timeout=60)
"""
STDOUT_RECORDS = 20000


def _stdout_writers(tmp_path: Path, lock: str) -> list[bytes]:
    """The lines WRITERS processes wrote to one pipe, read 256 bytes at a
    time (a slow collector: the pipe is full, writes go in parts)."""
    go = tmp_path / "go"
    read_end, write_end = os.pipe()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                STDOUT_CHILD,
                *map(str, (MODULE, go, wid, STDOUT_RECORDS)),
                lock,
            ],
            stdout=write_end,
        )
        for wid in range(WRITERS)
    ]
    os.close(write_end)
    time.sleep(0.3)  # let every child start and wait
    go.touch()
    chunks = []
    with open(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(256):
            chunks.append(chunk)
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    return b"".join(chunks).splitlines()


def _torn(lines: list[bytes]) -> list[bytes]:
    out = []
    for line in lines:
        try:
            json.loads(line)
        except ValueError:
            out.append(line)
    return out


@pytest.mark.parametrize("locked", [True, False], ids=["lock", "no-lock"])
def test_several_processes_on_one_stdout_pipe_never_tear_a_line(
    tmp_path: Path, locked: bool
) -> None:
    # Unlocked through each process's sys.stdout, batches of 64 KiB tore:
    # tens of lines a run here (1,035 of 60,000 in the review's run).
    lines = _stdout_writers(tmp_path, str(tmp_path / "requests.jsonl.lock") if locked else "")
    assert _torn(lines) == []
    records = [json.loads(line) for line in lines]
    for wid in range(WRITERS):
        assert [r["seq"] for r in records if r["writer"] == wid] == list(range(STDOUT_RECORDS))


def test_without_a_lock_lines_go_in_whole_line_writes_of_at_most_pipe_buf() -> None:
    data = b"".join(b"%d" % i + b"x" * 100 + b"\n" for i in range(200))
    chunks = list(line_chunks(data, 4096))
    assert b"".join(chunks) == data
    assert all(len(c) <= 4096 and c.endswith(b"\n") for c in chunks)
    long = b"y" * 5000 + b"\n"
    assert list(line_chunks(b"a\n" + long + b"b\n", 4096)) == [b"a\n", long, b"b\n"]
    assert list(line_chunks(b"", 4096)) == []


def test_the_router_to_stdout_takes_turns_on_the_request_log_lock(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    router = tmp_path / "router"
    router.mkdir()
    routes = {"code": {"variant": "ngram", "canary_percent": 5}}
    (router / "routing.json").write_text(json.dumps({"schema_version": 1, "routes": routes}))
    config = st.RolloutConfig(log={**st.RolloutConfig().log, "destination": "stdout"})

    class Stub:
        class Logger:
            @staticmethod
            def log_warn(message: str) -> None:
                pass

    live = Live(
        router, router / "routing.json", load_routing(router / "routing.json"), Stub, config
    )
    tracked = Tracked()
    tracked.route, tracked.choice, tracked.begun = (
        "code",
        Choice("ngram", "ngram", None, True),
        True,
    )
    tracked.request_id = "r1"
    live.end(tracked, None)
    live.close()
    out = capfd.readouterr().out
    assert [json.loads(line)["request_id"] for line in out.splitlines()] == ["r1"]
    folder = st.rollout_dir(router)
    assert (folder / "requests.jsonl.lock").exists()
    assert not (folder / st.LOG_FILE).exists()


# -- reading while writers rotate ----------------------------------------------


READ_CHILD = """
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("rollout_log_child", sys.argv[1])
log = importlib.util.module_from_spec(spec)
spec.loader.exec_module(log)
writer = log.LineWriter(Path(sys.argv[2]), max_bytes=2048, backups=3)
for i in range(10**6):
    writer.write({"i": i})
    if i % 50 == 0:
        writer.flush()
"""


def test_reading_while_a_writer_rotates_never_skips_a_file_or_fails(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", READ_CHILD, str(MODULE), str(path)])
    reads, gaps, failures = 0, [], []
    try:
        deadline = time.monotonic() + 10
        while len(log_files(path)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # rotating by now, its lock file made
        assert len(log_files(path)) >= 3
        until = time.monotonic() + 1.5
        while time.monotonic() < until:
            try:
                got = [r["i"] for r in read_lines(path)]
            except OSError as exc:
                failures.append(repr(exc))
                continue
            reads += 1
            if got != list(range(got[0], got[0] + len(got))):
                gaps.append(got)
    finally:
        proc.kill()
        proc.wait()
    # before: about one read in six missed a whole file, some raised
    # FileNotFoundError (r7b: 657 and 83 of 3,566)
    assert reads > 20
    assert (len(gaps), failures) == (0, [])


def test_read_lines_waits_for_a_writer_holding_the_lock(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    writer = LineWriter(path, max_bytes=4096, backups=2)
    writer.write({"i": 0})
    writer.close()
    fd = os.open(tmp_path / "requests.jsonl.lock", os.O_RDWR)
    got: list[object] = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a writer rotating
        reader = threading.Thread(target=lambda: got.append(read_lines(path)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and got == []
        fcntl.flock(fd, fcntl.LOCK_UN)
        reader.join(5)
        assert got == [[{"i": 0}]]
    finally:
        os.close(fd)


def test_without_the_lock_a_file_gone_meanwhile_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No lock file (none written yet, or a folder it cannot be read from):
    # a file listed and then rotated away is skipped, not an error.
    path = tmp_path / "requests.jsonl"
    path.write_text('{"i": 1}\n')
    gone = tmp_path / "requests.jsonl.1"
    monkeypatch.setattr(rollout_log, "log_files", lambda p: [gone, path])
    assert read_lines(path) == [{"i": 1}]
    assert not (tmp_path / "requests.jsonl.lock").exists()  # a reader never makes it


# -- after close ---------------------------------------------------------------


def test_a_line_written_after_close_is_refused_and_counted(tmp_path: Path) -> None:
    # The router's finalize waits a bounded time for requests, then closes
    # its writers; a request ending later must not vanish uncounted.
    path = tmp_path / "requests.jsonl"
    writer = LineWriter(path, max_bytes=10000, backups=1)
    writer.write({"i": 0})
    writer.close()
    assert writer.write({"i": 1}) is False
    assert (writer.written, writer.dropped) == (1, 1)
    started = time.monotonic()
    writer.flush(timeout=2)
    writer.close(timeout=2)  # a second close returns at once too
    assert time.monotonic() - started < 0.5
    assert read_lines(path) == [{"i": 0}]


def test_a_stuck_holder_of_the_stdout_lock_does_not_stop_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A frozen router keeps the stream's lock while it waits for its GIL:
    the others' batches then go out in whole-line PIPE_BUF pieces after
    STREAM_LOCK_WAIT_S instead of waiting (and dropping lines) for good."""
    monkeypatch.setattr(rollout_log, "STREAM_LOCK_WAIT_S", 0.05)
    lock = tmp_path / "requests.jsonl.lock"
    holder = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another open file: another "process"
    read_end, write_end = os.pipe()
    try:
        with open(write_end, "w") as stream:
            writer = rollout_log.LineWriter(None, stream=stream, lock=lock)
            for seq in range(300):
                writer.write({"seq": seq, "pad": "x" * 100})
            writer.close(timeout=10)
        with open(read_end, "rb") as pipe:
            lines = pipe.read().splitlines()
    finally:
        os.close(holder)
    assert [json.loads(line)["seq"] for line in lines] == list(range(300))
    assert writer.dropped == 0
    assert capfd.readouterr().err.count("held over 0.05 s by another process") == 1
