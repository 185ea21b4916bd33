"""A route's in-flight count shared by every router process of one server.

Triton runs the router as several stub processes (``instance_group { count:
N }``), and a route's ``max_concurrency`` and ``draft_len_schedule`` are about
what the route's variant serves, not what one stub sends it: each stub's own
count would let N times the limit through. So every stub keeps its counts in
one small file per server run, ``in_flight.<key>.json`` (``key``:
``run_key`` of the tritonserver, its pid and start time), holding ``{slot:
{route: count}}``, one slot per stub process (``<model_instance_name>/<pid>-
<start>``), and the limit applies to their sum.

Processes are named by pid and start time because both kinds of name get
reused. Triton names the instances of a reloaded model as it named the old
ones (``router_0_0``, ...) while the old ones still drain, and a restarted
container's processes often get the pids of the last run's, whose file (the
rollout folder lives in the model repository) is still there. A slot counts
while its process lives; a dead process's slot (a stub killed mid-request,
an old instance that drained) is dropped by whoever next writes the file,
and a stub's ``close`` removes its own.

Cost: a ``flock``, a ``stat`` and a read of that file (a few hundred bytes)
and one ``/proc`` read per other slot at the admit and at the release of each
limited request, and a write when this process's counts changed (a request
the limit turned away changes nothing); other requests never touch it.

Writes keep the file whole: a shorter text is padded with spaces to the old
length before it is written (JSON ignores them) and only then truncated, so a
process killed between the two leaves valid JSON, not a tail of old bytes
that would make every reader count nothing. A file deleted or replaced while
the server runs (by hand, by a cleanup) is reopened by path at each
process's next look, which writes that process's slot into it: until every
process has looked once, the new file misses the counts of those that have
not.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from trtspec.artifacts.routing import InFlight
from trtspec.procutil import pid_alive, start_ticks

Slots = dict[str, dict[str, int]]
# a key: a pid, and its start time where /proc has it
_FILE = re.compile(r"in_flight\.([1-9][0-9]{0,8})(?:-([0-9]{1,20}))?\.json")
# another server's file is removed only once it has been left alone this long
# (a server in another pid namespace sharing the folder looks dead from here)
STALE_S = 600.0


def run_key(pid: int) -> str:
    """The name of process ``pid`` for a file or slot: ``<pid>-<start>``
    (``<pid>`` where its start time cannot be read)."""
    start = start_ticks(pid)
    return str(pid) if start is None else f"{pid}-{start}"


def key_alive(key: str) -> bool:
    """Whether ``run_key``'s ``key`` names a process that still exists (the
    same one: a reused pid has another start time)."""
    pid, _, start = key.partition("-")
    if not pid.isdigit() or not 0 < int(pid) < 1 << 31:
        return False
    if start:
        return start.isdigit() and start_ticks(int(pid)) == int(start)
    return pid_alive(int(pid))


class SharedInFlight(InFlight):
    """``InFlight`` whose counts are the sum over the router processes of one
    server (see the module's docstring); ``close`` it when done.

    Raises ``OSError`` only when the file cannot be opened; afterwards a
    corrupt or unreadable file counts as empty and a failed update falls back
    to this process's own counts: this bookkeeping never fails a request.
    """

    def __init__(self, folder: Path, slot: str, key: int | str) -> None:
        super().__init__()
        self._slot = f"{slot}/{run_key(os.getpid())}"
        self.path = Path(folder) / f"in_flight.{key}.json"
        self._fd = self._open()
        # the first write names this process's slot and drops dead ones
        with self._lock, self._elsewhere(write=True, force=True):
            pass
        _remove_dead(Path(folder), self.path)

    def _open(self) -> int:
        return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def _lock_current(self) -> bool:
        """Lock the file at ``path`` (reopened when it was deleted or replaced
        since it was opened, this process's slot written into it at once);
        False when that fails: own counts only."""
        reopened = False
        for _ in range(3):
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except (OSError, ValueError):  # refused, or closed (fd -1)
                return False
            try:
                held, named = os.fstat(self._fd), os.stat(self.path)
                if (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino):
                    if reopened:  # the others learn of this process at their next look
                        size, slots = self._read()
                        slots[self._slot] = {r: n for r, n in self._counts.items() if n}
                        self._write(slots, size)
                    return True
            except FileNotFoundError:
                pass
            except OSError:
                return True  # cannot tell: go on with the open one
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            try:
                fd = self._open()
            except OSError:
                return False
            os.close(self._fd)
            self._fd, reopened = fd, True
        return False

    @contextmanager
    def _elsewhere(self, write: bool, force: bool = False) -> Iterator[dict[str, int]]:
        """The other slots' sums per route, read with the file locked; on
        ``write``, this process's counts, when they changed (``force``:
        always), are written into its slot before the file is unlocked."""
        if not self._lock_current():
            yield {}
            return
        try:
            size, slots = self._read()
            totals: dict[str, int] = {}
            for counts in slots.values():
                for route, n in counts.items():
                    totals[route] = totals.get(route, 0) + n
            before = dict(self._counts)
            yield totals
            if write and (force or self._counts != before):
                slots[self._slot] = {route: n for route, n in self._counts.items() if n}
                self._write(slots, size)
        finally:
            with suppress(OSError, ValueError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _write(self, slots: Slots, size: int) -> None:
        data = json.dumps(slots, sort_keys=True, separators=(",", ":")).encode()
        with suppress(OSError):
            # padded to the old length first: whole JSON even if this process
            # dies before the truncate
            os.pwrite(self._fd, data.ljust(size), 0)
            os.ftruncate(self._fd, len(data))

    def _read(self) -> tuple[int, Slots]:
        """The file's size and its slots of this server's other live router
        processes, well-formed counts only; a corrupt or unreadable file
        counts as empty."""
        try:
            size = os.fstat(self._fd).st_size
        except OSError:
            return 0, {}
        try:  # a corrupt file's size still pads the next write
            data = json.loads(os.pread(self._fd, size, 0))
        except (OSError, ValueError):
            return size, {}
        if not isinstance(data, dict):
            return size, {}
        return size, {
            slot: {
                route: n
                for route, n in counts.items()
                if isinstance(n, int) and not isinstance(n, bool) and n > 0
            }
            for slot, counts in data.items()
            if slot != self._slot and isinstance(counts, dict) and _live_slot(slot)
        }

    def close(self) -> None:
        """Take this process's slot out of the file and release it; later
        calls count this process only."""
        with self._lock:
            if self._fd < 0:
                return
            if self._lock_current():
                try:
                    size, slots = self._read()
                    self._write(slots, size)  # without this process's slot
                finally:
                    with suppress(OSError, ValueError):
                        fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def _live_slot(slot: str) -> bool:
    """Whether ``<instance>/<run key>`` names a process that still exists."""
    return key_alive(slot.rpartition("/")[2])


def _remove_dead(folder: Path, current: Path) -> None:
    """Delete the files of earlier server runs: a key whose process is gone
    (never ``current``, never a live process's, never one written in the
    last ``STALE_S``)."""
    now = time.time()
    for path in folder.glob("in_flight.*.json"):
        match = _FILE.fullmatch(path.name)
        if match is None or path == current:
            continue
        key = match[1] if match[2] is None else f"{match[1]}-{match[2]}"
        if key_alive(key):  # another user's live pid counts as alive
            continue
        with suppress(OSError):
            if now - path.stat().st_mtime >= STALE_S:
                path.unlink()
