"""A server's footprint: its ready time, its memory over a run and its stop time.

Memory is read from ``/proc/<pid>/smaps_rollup`` of every live process in the
server's process group (tritonserver and each Python-backend stub, which the
supervisor starts in one group): **RSS** counts every resident page of each
process, so a page that several processes share (a shared library, a weight
file memory-mapped by several engine stubs) counts once per process; **PSS**
divides each shared page among the processes that map it, so the sum over the
group is what the server holds in RAM, each page counted once. Issue 24's
memory target ("server resident memory under 4 GB") is checked against the
PSS sum; both are reported. ``MemorySampler`` samples the group in a thread
and keeps the peak of each sum. Stdlib only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
GB = 1000**3
# issue 24 item 3: the demo repository's targets on two cores
READY_TARGET_S = 15.0
MEMORY_TARGET_BYTES = 4 * GB
STOP_TARGET_S = 2.0


@dataclass(frozen=True)
class Memory:
    """Resident memory summed over a set of processes, in bytes."""

    rss: int = 0
    pss: int = 0
    processes: int = 0


def process_memory(pid: int, proc: Path = Path("/proc")) -> Memory | None:
    """One process's RSS and PSS (``smaps_rollup``); ``None`` once it is gone
    or unreadable (another user's process)."""
    try:
        text = (proc / str(pid) / "smaps_rollup").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Rss", "Pss"):
            values[key] = int(rest.split()[0]) * 1024  # kB
    if "Rss" not in values:
        return None  # a kernel thread or a process that exited mid-read
    return Memory(rss=values["Rss"], pss=values.get("Pss", values["Rss"]), processes=1)


def total_memory(pids: Iterable[int], proc: Path = Path("/proc")) -> Memory:
    """The sum of ``process_memory`` over ``pids`` (gone ones skipped)."""
    rss = pss = n = 0
    for pid in pids:
        one = process_memory(pid, proc)
        if one is not None:
            rss, pss, n = rss + one.rss, pss + one.pss, n + 1
    return Memory(rss=rss, pss=pss, processes=n)


def group_memory(pgid: int) -> Memory:
    """Resident memory of every live process in process group ``pgid``."""
    from trtspec.serve.supervisor import group_members

    return total_memory(group_members(pgid))


class MemorySampler:
    """Samples ``measure()`` every ``interval_s`` in a daemon thread from
    ``start()`` to ``stop()`` and keeps the peak RSS and peak PSS seen (each
    its own maximum: they need not come from the same sample)."""

    def __init__(self, measure: Callable[[], Memory], interval_s: float = 0.5) -> None:
        self._measure = measure
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self.samples = 0

    @classmethod
    def of_group(cls, pgid: int, interval_s: float = 0.5) -> MemorySampler:
        return cls(lambda: group_memory(pgid), interval_s)

    def sample(self) -> Memory:
        memory = self._measure()
        with self._lock:
            self.peak_rss = max(self.peak_rss, memory.rss)
            self.peak_pss = max(self.peak_pss, memory.pss)
            self.peak_processes = max(self.peak_processes, memory.processes)
            self.samples += 1
        return memory

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def start(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Memory:
        """Stop sampling (after one last sample); returns the peaks."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            return self.peak()

    def peak(self) -> Memory:
        return Memory(rss=self.peak_rss, pss=self.peak_pss, processes=self.peak_processes)


@dataclass(frozen=True)
class Footprint:
    """What a run saw of its server: seconds to ready, peak memory, seconds to stop."""

    ready_s: float
    peak: Memory
    stop_s: float | None = None

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "ready_s": round(self.ready_s, 2),
            "peak_rss_bytes": self.peak.rss,
            "peak_pss_bytes": self.peak.pss,
            "processes": self.peak.processes,
            "stop_s": None if self.stop_s is None else round(self.stop_s, 2),
        }

    @classmethod
    def from_json(cls, data: dict[str, float | int | None]) -> Footprint:
        stop = data.get("stop_s")
        return cls(
            ready_s=float(data["ready_s"] or 0.0),
            peak=Memory(
                rss=int(data["peak_rss_bytes"] or 0),
                pss=int(data["peak_pss_bytes"] or 0),
                processes=int(data.get("processes") or 0),
            ),
            stop_s=None if stop is None else float(stop),
        )

    def lines(self) -> list[str]:
        """The footprint against issue 24's targets, one line per measure."""

        def verdict(ok: bool) -> str:
            return "meets" if ok else "MISSES"

        pss_gb, rss_gb = self.peak.pss / GB, self.peak.rss / GB
        out = [
            f"ready in {self.ready_s:.1f} s "
            f"({verdict(self.ready_s <= READY_TARGET_S)} the {READY_TARGET_S:g} s target)",
            f"peak memory {pss_gb:.2f} GB PSS ({self.peak.pss / MIB:,.0f} MiB; "
            f"{verdict(self.peak.pss < MEMORY_TARGET_BYTES)} the "
            f"{MEMORY_TARGET_BYTES / GB:g} GB target), {rss_gb:.2f} GB RSS "
            f"({self.peak.rss / MIB:,.0f} MiB) over {self.peak.processes} processes",
        ]
        if self.stop_s is not None:
            out.append(
                f"stopped in {self.stop_s:.1f} s "
                f"({verdict(self.stop_s < STOP_TARGET_S)} the {STOP_TARGET_S:g} s target)"
            )
        return out


def own_memory() -> Memory:
    """This process alone (for tests and in-process measurements)."""
    return total_memory([os.getpid()])
