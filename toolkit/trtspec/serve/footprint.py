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
and keeps the peak of each sum. Each process is also named after what it
serves (``process_name``: a stub's model, read from the ``model.py`` path on
its command line; ``tritonserver`` for the server), so a footprint says where
its memory is: every model's own peak PSS, and the models' PSS in the sample
where the sum peaked, for the whole run and for each phase the caller
names (``set_phase``: the bench marks ``loading`` until the server is ready,
then ``serving``; an engine stub's load and its requests peak apart). Stdlib
only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
GB = 1000**3
# issue 24 item 3: the demo repository's targets on two cores
READY_TARGET_S = 15.0
MEMORY_TARGET_BYTES = 4 * GB
STOP_TARGET_S = 2.0


#: models named one by one in ``Footprint.lines``; the rest are summed
TOP_MODELS = 4
LOADING, SERVING = "loading", "serving"


@dataclass(frozen=True)
class Memory:
    """Resident memory summed over a set of processes, in bytes; ``models``:
    PSS per ``process_name`` (empty unless asked for)."""

    rss: int = 0
    pss: int = 0
    processes: int = 0
    models: Mapping[str, int] = field(default_factory=dict)


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


def process_name(pid: int, proc: Path = Path("/proc")) -> str:
    """What process ``pid`` serves: a Python-backend stub's model (its
    command line names ``<repo>/<model>/<version>/model.py``), else the base
    name of its program (``tritonserver``); ``"?"`` once it is gone."""
    try:
        argv = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    for arg in argv:
        text = arg.decode("utf-8", "replace")
        if text.endswith("model.py"):
            return Path(text).parent.parent.name
    return Path(argv[0].decode("utf-8", "replace")).name if argv and argv[0] else "?"


def total_memory(
    pids: Iterable[int], proc: Path = Path("/proc"), *, by_model: bool = False
) -> Memory:
    """The sum of ``process_memory`` over ``pids`` (gone ones skipped); with
    ``by_model``, also the PSS per ``process_name``."""
    rss = pss = n = 0
    models: dict[str, int] = {}
    for pid in pids:
        one = process_memory(pid, proc)
        if one is not None:
            rss, pss, n = rss + one.rss, pss + one.pss, n + 1
            if by_model:
                name = process_name(pid, proc)
                models[name] = models.get(name, 0) + one.pss
    return Memory(rss=rss, pss=pss, processes=n, models=models)


def group_memory(pgid: int) -> Memory:
    """Resident memory of every live process in process group ``pgid``, per model too."""
    from trtspec.serve.supervisor import group_members

    return total_memory(group_members(pgid), by_model=True)


class MemorySampler:
    """Samples ``measure()`` every ``interval_s`` in a daemon thread from
    ``start()`` to ``stop()`` and keeps the peak RSS and peak PSS seen (each
    its own maximum: they need not come from the same sample), each model's
    own peak PSS, and the sample whose PSS sum peaked (``at_peak``), overall
    and per phase (``at_peak_of``; samples belong to the phase last set)."""

    def __init__(self, measure: Callable[[], Memory], interval_s: float = 0.5) -> None:
        self._measure = measure
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.peak_rss = 0
        self.peak_pss = 0
        self.peak_processes = 0
        self.peak_models: dict[str, int] = {}
        self.at_peak = Memory()
        self.phase = LOADING
        self.at_peak_of: dict[str, Memory] = {}
        self.samples = 0

    @classmethod
    def of_group(cls, pgid: int, interval_s: float = 0.5) -> MemorySampler:
        return cls(lambda: group_memory(pgid), interval_s)

    def sample(self) -> Memory:
        memory = self._measure()
        with self._lock:
            self.peak_rss = max(self.peak_rss, memory.rss)
            if memory.pss > self.peak_pss or not self.samples:
                self.at_peak = memory
            self.peak_pss = max(self.peak_pss, memory.pss)
            held = self.at_peak_of.get(self.phase)
            if held is None or memory.pss > held.pss:
                self.at_peak_of[self.phase] = memory
            for name, pss in memory.models.items():
                self.peak_models[name] = max(self.peak_models.get(name, 0), pss)
            self.peak_processes = max(self.peak_processes, memory.processes)
            self.samples += 1
        return memory

    def set_phase(self, phase: str) -> None:
        """Count the samples from now on (this one included) to ``phase``."""
        with self._lock:
            self.phase = phase
        self.sample()

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
        """The peaks; ``models`` holds each model's own peak PSS."""
        return Memory(
            rss=self.peak_rss,
            pss=self.peak_pss,
            processes=self.peak_processes,
            models=dict(self.peak_models),
        )


def _by_size(models: Mapping[str, int]) -> dict[str, int]:
    """Largest first; a name holding nothing (a helper process that was just
    starting or exiting) is left out."""
    return dict(
        sorted(((k, v) for k, v in models.items() if v > 0), key=lambda kv: (-kv[1], kv[0]))
    )


def top_models(models: Mapping[str, int], n: int = TOP_MODELS) -> str:
    """The ``n`` largest models' MiB and the rest summed, e.g. ``"target 830,
    tritonserver 310, 3 others 95 MiB"``."""
    ranked = list(_by_size(models).items())
    parts = [f"{name} {pss / MIB:,.0f}" for name, pss in ranked[:n]]
    rest = ranked[n:]
    if rest:
        label = rest[0][0] if len(rest) == 1 else f"{len(rest)} others"
        parts.append(f"{label} {sum(p for _, p in rest) / MIB:,.0f}")
    return ", ".join(parts) + " MiB"


@dataclass(frozen=True)
class Footprint:
    """What a run saw of its server: seconds to ready, peak memory, seconds to stop."""

    ready_s: float
    peak: Memory
    stop_s: float | None = None
    #: the sample whose PSS sum was ``peak.pss``, with its models' PSS
    at_peak: Memory | None = None
    #: the same per phase (``MemorySampler.set_phase``), in phase order
    phases: Mapping[str, Memory] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ready_s": round(self.ready_s, 2),
            "peak_rss_bytes": self.peak.rss,
            "peak_pss_bytes": self.peak.pss,
            "processes": self.peak.processes,
            "stop_s": None if self.stop_s is None else round(self.stop_s, 2),
        }
        if self.peak.models:
            out["peak_pss_by_model_bytes"] = _by_size(self.peak.models)
        if self.at_peak is not None and self.at_peak.models:
            out["pss_at_peak_by_model_bytes"] = _by_size(self.at_peak.models)
        if self.phases:
            out["phases"] = {
                name: {
                    "peak_pss_bytes": m.pss,
                    "rss_bytes": m.rss,
                    "pss_by_model_bytes": _by_size(m.models),
                }
                for name, m in self.phases.items()
            }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Footprint:
        stop = data.get("stop_s")
        at_peak = data.get("pss_at_peak_by_model_bytes") or {}
        phases = {
            name: Memory(
                rss=int(p.get("rss_bytes") or 0),
                pss=int(p.get("peak_pss_bytes") or 0),
                processes=len(p.get("pss_by_model_bytes") or {}),
                models={k: int(v) for k, v in (p.get("pss_by_model_bytes") or {}).items()},
            )
            for name, p in (data.get("phases") or {}).items()
        }
        return cls(
            ready_s=float(data["ready_s"] or 0.0),
            peak=Memory(
                rss=int(data["peak_rss_bytes"] or 0),
                pss=int(data["peak_pss_bytes"] or 0),
                processes=int(data.get("processes") or 0),
                models={k: int(v) for k, v in (data.get("peak_pss_by_model_bytes") or {}).items()},
            ),
            stop_s=None if stop is None else float(stop),
            at_peak=Memory(
                pss=sum(int(v) for v in at_peak.values()),
                processes=len(at_peak),
                models={k: int(v) for k, v in at_peak.items()},
            )
            if at_peak
            else None,
            phases=phases,
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
        for phase, m in self.phases.items():
            out.append(f"while {phase}: {m.pss / GB:.2f} GB PSS at most: {top_models(m.models)}")
        if not self.phases and self.at_peak is not None and self.at_peak.models:
            out.append(f"at the peak: {top_models(self.at_peak.models)}")
        if self.stop_s is not None:
            out.append(
                f"stopped in {self.stop_s:.1f} s "
                f"({verdict(self.stop_s < STOP_TARGET_S)} the {STOP_TARGET_S:g} s target)"
            )
        return out


def own_memory() -> Memory:
    """This process alone (for tests and in-process measurements)."""
    return total_memory([os.getpid()])
