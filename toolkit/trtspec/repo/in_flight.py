"""A route's in-flight count shared by every router process of one server.

Triton runs the router as several stub processes (``instance_group { count:
N }``), and a route's ``max_concurrency`` and ``draft_len_schedule`` are about
what the route's variant serves, not what one stub sends it: each stub's own
count would let N times the limit through. So every stub keeps its counts in
one small file per server run, ``in_flight.<key>.json`` (``key``: the
tritonserver's pid), holding ``{slot: {route: count}}``, one slot per stub
process (``<model_instance_name>/<pid>``), and the limit applies to their sum.

The pid in the slot's name matters at a model reload: Triton names the new
instances as it named the old ones (``router_0_0``, ...) while the old ones
still drain their requests, so a slot named by the instance alone would be
shared by two processes overwriting each other's counts. A slot counts while
its process lives; a dead process's slot (a stub killed mid-request, an old
instance that drained) is dropped by whoever next writes the file.

Cost: a ``flock``, a read of that file (a few hundred bytes) and one
``kill(pid, 0)`` per other slot at the admit and at the release of each
limited request, and a write when this process's counts changed (a request
the limit turned away changes nothing); other requests never touch it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from trtspec.procutil import pid_alive
from trtspec.repo.routing import InFlight

Slots = dict[str, dict[str, int]]
_FILE = re.compile(r"in_flight\.([1-9][0-9]{0,8})\.json")  # a pid key


class SharedInFlight(InFlight):
    """``InFlight`` whose counts are the sum over the router processes of one
    server (see the module's docstring); ``close`` it when done.

    Raises ``OSError`` only when the file cannot be opened; afterwards a
    corrupt or unreadable file counts as empty and a failed update falls back
    to this process's own counts: this bookkeeping never fails a request.
    """

    def __init__(self, folder: Path, slot: str, key: int | str) -> None:
        super().__init__()
        self._slot = f"{slot}/{os.getpid()}"
        self.path = Path(folder) / f"in_flight.{key}.json"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        # the first write names this process's slot and drops dead ones
        with self._lock, self._elsewhere(write=True, force=True):
            pass
        _remove_dead(Path(folder), self.path)

    @contextmanager
    def _elsewhere(self, write: bool, force: bool = False) -> Iterator[dict[str, int]]:
        """The other slots' sums per route, read with the file locked; on
        ``write``, this process's counts, when they changed (``force``:
        always), are written into its slot before the file is unlocked."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except (OSError, ValueError):  # refused, or closed (fd -1): own counts only
            yield {}
            return
        try:
            slots = self._read()
            totals: dict[str, int] = {}
            for counts in slots.values():
                for route, n in counts.items():
                    totals[route] = totals.get(route, 0) + n
            before = dict(self._counts)
            yield totals
            if write and (force or self._counts != before):
                slots[self._slot] = {route: n for route, n in self._counts.items() if n}
                data = json.dumps(slots, sort_keys=True, separators=(",", ":")).encode()
                with suppress(OSError):
                    os.pwrite(self._fd, data, 0)
                    os.ftruncate(self._fd, len(data))
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def _read(self) -> Slots:
        """The file's slots of this server's other live router processes,
        well-formed counts only; a corrupt or unreadable file counts as
        empty."""
        try:
            data = json.loads(os.pread(self._fd, os.fstat(self._fd).st_size, 0))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            slot: {
                route: n
                for route, n in counts.items()
                if isinstance(n, int) and not isinstance(n, bool) and n > 0
            }
            for slot, counts in data.items()
            if slot != self._slot and isinstance(counts, dict) and _live_slot(slot)
        }

    def close(self) -> None:
        """Release the file descriptor; later calls count this process only."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def _live_slot(slot: str) -> bool:
    """Whether ``<instance>/<pid>`` names a process that still exists (a pid
    reused by another process keeps a slot until this server's run ends: its
    file is per run)."""
    _, _, pid = slot.rpartition("/")
    return pid.isdigit() and 0 < int(pid) < 1 << 31 and pid_alive(int(pid))


def _remove_dead(folder: Path, current: Path) -> None:
    """Delete the files of earlier server runs: a pid key whose process is
    gone (never ``current``, never a live pid's)."""
    for path in folder.glob("in_flight.*.json"):
        match = _FILE.fullmatch(path.name)
        if match is None or path == current:
            continue
        if not pid_alive(int(match[1])):  # another user's live pid counts as alive
            with suppress(OSError):
                path.unlink()
