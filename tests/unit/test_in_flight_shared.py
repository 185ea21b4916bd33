"""``SharedInFlight``: the router's in-flight counts summed over the router
processes of one server through a small locked file, so a route's
``max_concurrency`` and ``draft_len_schedule`` hold across all of them."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from trtspec.artifacts.routing import Choice, choose, parse_routing
from trtspec.runtime import in_flight
from trtspec.runtime.in_flight import SharedInFlight, run_key

ROUTES = {
    "routes": {
        "code": {"variant": "ngram", "max_concurrency": 3},
        "rag": {"variant": "ngram", "draft_len_schedule": {"1": 4, "3": 2}},
    }
}
TABLE = parse_routing(ROUTES)
SLOTS = ["router_0_0", "router_0_1"]


def admit(flight: SharedInFlight, route: str, request_id: str = "r") -> Choice:
    return flight.admit(TABLE, route, choose(TABLE, route, request_id))


def pair(folder: Path, key: int | str = "run") -> tuple[SharedInFlight, SharedInFlight]:
    return SharedInFlight(folder, SLOTS[0], key), SharedInFlight(folder, SLOTS[1], key)


def slots_in(path: Path) -> dict[str, dict[str, int]]:
    """The file's slots by instance name (each is ``<instance>/<pid>``)."""
    return {
        slot.rpartition("/")[0]: counts for slot, counts in json.loads(path.read_text()).items()
    }


def test_two_processes_slots_share_the_limit(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    first = [admit(a, "code"), admit(a, "code"), admit(b, "code")]
    assert [c.variant for c in first] == ["ngram"] * 3
    assert admit(b, "code").variant == "baseline"  # the 4th across both
    assert admit(a, "code").variant == "baseline"
    assert a.count("code") == b.count("code") == 3
    a.release(TABLE, "code", first[0])  # a release on either frees a place
    assert b.count("code") == 2
    again = admit(b, "code")
    assert again.variant == "ngram"
    for flight, choice in ((a, first[1]), (b, first[2]), (b, again)):
        flight.release(TABLE, "code", choice)
    assert a.count("code") == b.count("code") == 0
    assert slots_in(tmp_path / "in_flight.run.json") == {s: {} for s in SLOTS}
    a.close()  # a closed process takes its slot out
    assert slots_in(tmp_path / "in_flight.run.json") == {SLOTS[1]: {}}
    b.close()


def _hammer(folder: str, slot: str, *, start: Any, live: Any, peak: Any, fell: Any) -> None:
    """300 admit/release pairs on 3 threads, holding each admitted request
    briefly; ``live``/``peak`` count what was admitted across processes (an
    unlocked file loses updates: then they pass the limit)."""
    flight = SharedInFlight(Path(folder), slot, "run")
    start.wait()

    def worker(n: int) -> None:
        for i in range(100):
            choice = admit(flight, "code", f"{slot}-{n}-{i}")
            if not choice.canary:
                with fell.get_lock():
                    fell.value += 1
                continue
            with live.get_lock():
                live.value += 1
                peak.value = max(peak.value, live.value)
            time.sleep(0)  # hold it: the other threads run (longer holds race less)
            with live.get_lock():
                live.value -= 1
            flight.release(TABLE, "code", choice)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flight.close()


def test_processes_hammering_never_exceed_the_limit(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    live, peak, fell = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("i", 0)
    procs = [
        ctx.Process(
            target=_hammer,
            args=(str(tmp_path), slot),
            kwargs={"start": start, "live": live, "peak": peak, "fell": fell},
        )
        for slot in SLOTS
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
    # never passed; whether 3 were ever live at one instant between the
    # counters' updates is the scheduler's (a slow VM saw at most 2)
    assert 0 < peak.value <= 3
    # the limit was reached: a request falls back only when the summed
    # count stood at 3 (6 threads contended for 3 places)
    assert fell.value > 0
    assert json.loads((tmp_path / "in_flight.run.json").read_text()) == {}  # both closed


def test_draft_length_follows_the_summed_count(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    choices = [admit(flight, "rag") for flight in (a, b, a, b)]
    assert [c.num_draft_tokens for c in choices] == [4, 4, 2, 2]
    assert b.count("rag") == 4
    a.release(TABLE, "rag", choices[0])
    a.release(TABLE, "rag", choices[2])
    assert admit(b, "rag").num_draft_tokens == 2  # 3 in flight: a's two are gone
    b.release(TABLE, "rag", choices[1])
    assert admit(a, "rag").num_draft_tokens == 2
    a.close()
    b.close()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_dead_processes_slots_and_old_files_are_dropped(tmp_path: Path) -> None:
    key, gone, fresh = _dead_pid(), _dead_pid(), _dead_pid()  # its own file is kept even so
    path = tmp_path / f"in_flight.{key}.json"
    me = run_key(os.getpid())
    live = f"router_0_1/{me}"
    stale = {
        f"router_0_0/{_dead_pid()}": {"code": 2},  # a stub killed mid-request
        f"router_0_2/{os.getpid()}-1": {"code": 3},  # a live pid, another start: reused
        live: {"code": 1},
        "router_0_0": {"code": 5},  # no pid: not a slot this version writes
        "router_0_0/x": {"code": 7},
    }
    path.write_text(json.dumps(stale))
    names = (gone, f"{gone}-123", fresh, me, f"{os.getpid()}-1", "x")
    files = {name: tmp_path / f"in_flight.{name}.json" for name in names}
    for name, file in files.items():
        file.write_text("{}")
        if name != fresh:  # left alone for longer than STALE_S
            old = time.time() - in_flight.STALE_S - 5
            os.utime(file, (old, old))
    flight = SharedInFlight(tmp_path, "router_0_0", key)
    assert flight.count("code") == 1  # only the live process's
    assert json.loads(path.read_text()) == {f"router_0_0/{me}": {}, live: {"code": 1}}
    assert not files[gone].exists() and not files[f"{gone}-123"].exists()
    assert not files[f"{os.getpid()}-1"].exists()  # this pid, another process's start
    assert files[fresh].exists()  # dead, but written lately: maybe another pid namespace's
    assert files[me].exists()  # a live process's
    assert files["x"].exists()  # not a key
    flight.close()


def test_a_write_cut_short_leaves_whole_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed between writing a shorter text and truncating the
    file leaves padding, not the old text's tail: the others' counts stay."""
    a, b = pair(tmp_path)
    held = [admit(a, "code") for _ in range(2)]
    admit(b, "code")
    monkeypatch.setattr(in_flight.os, "ftruncate", lambda *_: None)  # "killed" before it
    a.release(TABLE, "code", held[0])
    a.release(TABLE, "code", held[1])
    monkeypatch.undo()
    text = (tmp_path / "in_flight.run.json").read_text()
    assert text.endswith(" ") and json.loads(text)  # padded, whole
    assert a.count("code") == 1  # b's, still seen
    assert [admit(a, "code").variant for _ in range(3)] == ["ngram", "ngram", "baseline"]
    a.close()
    b.close()


def test_a_deleted_file_is_reopened_by_path(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    admit(a, "code")
    admit(b, "code")
    (tmp_path / "in_flight.run.json").unlink()  # a cleanup while the server runs
    admit(a, "code")  # a writes into a new file at the path
    late = SharedInFlight(tmp_path, "router_0_2", "run")  # e.g. a restarted stub
    assert late.count("code") == 2  # a's two; b's one shows at its next look
    assert b.count("code") == 3  # b looked: reopened, its slot written
    assert late.count("code") == 3
    assert admit(late, "code").variant == "baseline"  # one limit, not one per file
    for flight in (a, b, late):
        flight.close()


def _old_instance(folder: str, held: Any, go: Any) -> None:
    """An instance that holds two requests of a limited route, then ends
    without releasing them (killed mid-request)."""
    flight = SharedInFlight(Path(folder), SLOTS[0], "run")
    admit(flight, "code", "old-1")
    admit(flight, "code", "old-2")
    held.set()
    go.wait(30)
    os._exit(0)


def test_a_reloaded_instance_of_the_same_name_counts_apart_from_the_draining_one(
    tmp_path: Path,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    held, go = ctx.Event(), ctx.Event()
    old = ctx.Process(target=_old_instance, args=(str(tmp_path), held, go))
    old.start()
    try:
        assert held.wait(60)
        new = SharedInFlight(tmp_path, SLOTS[0], "run")  # the name Triton reuses
        assert new.count("code") == 2  # the draining process's requests still count
        assert admit(new, "code").variant == "ngram"
        assert admit(new, "code").variant == "baseline"  # 3 across both
    finally:
        go.set()
        old.join(timeout=30)
    assert old.exitcode == 0
    assert new.count("code") == 1  # the ended process's slot is gone
    assert admit(new, "code").variant == "ngram"
    new.close()


def test_a_turned_away_request_writes_nothing(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    for _ in range(3):
        admit(a, "code")
    path = tmp_path / "in_flight.run.json"
    before = path.stat().st_mtime_ns, path.read_bytes()
    os.utime(path, ns=(0, 0))
    assert [admit(b, "code").variant for _ in range(5)] == ["baseline"] * 5
    assert path.stat().st_mtime_ns == 0, "a refused admit rewrote the file"
    assert path.read_bytes() == before[1]
    a.close()
    b.close()


@pytest.mark.parametrize(
    "content", [b"{not json", b"\xff\xfe", b"[1, 2]", b'{"router_0_1": {"code": "many"}}']
)
def test_a_corrupt_file_counts_as_empty(tmp_path: Path, content: bytes) -> None:
    a, b = pair(tmp_path)
    (tmp_path / "in_flight.run.json").write_bytes(content)
    assert b.count("code") == 0
    assert [admit(a, "code").variant for _ in range(4)] == ["ngram"] * 3 + ["baseline"]
    assert b.count("code") == 3  # and the file is whole again
    a.close()
    b.close()


def test_a_failing_file_falls_back_to_own_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair(tmp_path)
    held = [admit(b, "code"), admit(b, "code")]

    def refuse(*_: Any) -> None:
        raise OSError("no locks here")

    monkeypatch.setattr("trtspec.runtime.in_flight.fcntl.flock", refuse)
    assert [admit(a, "code").variant for _ in range(4)] == ["ngram"] * 3 + ["baseline"]
    a.release(TABLE, "code", held[0])  # never raises
    assert a.count("code") == 2
    monkeypatch.undo()
    assert a.count("code") == 4  # b's 2 from the file, a's own 2 (its writes failed)
    a.close()
    b.close()


def test_an_ended_unreaped_process_counts_as_dead() -> None:
    """tritonserver does not reap its stubs: a crashed router stays a zombie
    with its pid and start time, and its slot must not count."""
    from trtspec.procutil import start_ticks

    proc = subprocess.Popen(["sleep", "0.2"])
    key = run_key(proc.pid)
    assert in_flight.key_alive(key)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    try:
        assert start_ticks(proc.pid) is None
        assert not in_flight.key_alive(key)
    finally:
        proc.wait()
