"""The request log with several router processes on one file (Triton's
``instance_group { count: N }``): every line whole and kept once, rotation
by one process at a time, every file within ``max_bytes``, and a writer
that follows a file another writer rotated away."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from trtspec.repo.models import rollout_log
from trtspec.repo.models.rollout_log import LineWriter, log_files, read_lines

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
