"""The stub watchdog: notices within a poll interval (default 0.5 s) that a
Python-backend stub of a supervised tritonserver died, that one froze (its
heartbeat stopped: ``trtspec.runtime.heartbeat``, the 2.51 stub's BLS deadlock), or
that the server itself did, and gets the models serving again.

Why it is needed: when a stub dies (the SIGSEGV of the 2.51 bundled Python
backend, docs/design/triton-limits.md), tritonserver neither reaps it nor marks the
model unready — the stub stays a zombie child, ``/v2/models/<m>/ready`` keeps
answering 200, and every request already inside that model waits for the BLS
deadline. The watchdog reads ``/proc``: every ``triton_python_backend_stub``
descendant of the server, its instance name (argv[8], e.g. ``router_0_0``)
and, once it is a zombie, its wait status (field 52 of ``stat``), so the
incident says "killed by SIGSEGV". Recovery restarts the server on the same
ports (``Server.restart``): that fails the requests in flight at once (their
streams close) instead of leaving them to hang, and it does not depend on
unloading a model whose in-flight requests are blocked on the dead stub,
which Triton's unload would wait for. Each incident is kept as plain data
(model, pid, cause, detection and recovery times) for ``trtspec serve``'s
stderr and the benchmark's ``summary.json``.

A frozen stub (alive, asleep for good, its heartbeat file older than
``heartbeat.FROZEN_S``) is killed with SIGKILL and handled as a crash of
kind ``stub_frozen``: the same restart, or the same "variant down" where
the router has a fallback for it. Only stubs that beat are judged; one that
never wrote a heartbeat (a model that does not beat, or a server started
without the folder) is never taken for frozen.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trtspec.errors import ServerError
from trtspec.runtime import heartbeat
from trtspec.runtime.health import mark_down

STUB_BINARY = "triton_python_backend_stub"
_wall_clock, _perf_ns = time.time, time.perf_counter_ns
_INSTANCE = re.compile(r"^(?P<model>.+)_\d+_\d+$")
# incident kinds where one stub is dead (crashed, or frozen and killed)
STUB_DEATHS = ("stub_crash", "stub_frozen")


@dataclass
class Stub:
    pid: int
    instance: str
    zombie: bool
    wait_status: int | None

    @property
    def model(self) -> str:
        match = _INSTANCE.match(self.instance)
        return match.group("model") if match else self.instance


@dataclass
class Incident:
    """One dead stub (or dead server) and what the watchdog did about it."""

    kind: str  # "stub_crash" | "stub_frozen" | "server_exit" | "stub_unresponsive"
    model: str | None
    pid: int | None
    cause: str
    time: float = field(default_factory=_wall_clock)
    time_ns: int = field(default_factory=_perf_ns)
    action: str = ""
    recovered: bool = False
    recovery_s: float | None = None
    error: str | None = None
    done_ns: int | None = None  # when recovery ended (or None while it runs)

    def message(self) -> str:
        model = repr(self.model) if self.model else "(not known: it died before the first look)"
        what = (
            f"the Python-backend stub of model {model} (pid {self.pid}) {self.cause}"
            if self.kind in STUB_DEATHS
            else f"tritonserver (pid {self.pid}) {self.cause}"
            if self.kind == "server_exit"
            else f"model {self.model!r}: {self.cause}"
        )
        if self.action.startswith("variant"):  # left down, its routes on their fallback
            return f"{what}; requests already streaming from it may fail"
        return f"{what}; the requests in flight failed"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("time_ns")
        out.pop("done_ns")
        out["message"] = self.message()
        return out


def describe_wait_status(status: int | None) -> str:
    """``killed by SIGSEGV`` / ``exited with code 1`` from a wait status."""
    if status is None:
        return "exited"
    if status & 0x7F:
        try:
            name = signal.Signals(status & 0x7F).name
        except ValueError:
            name = f"signal {status & 0x7F}"
        return f"was killed by {name}"
    return f"exited with code {(status >> 8) & 0xFF}"


def exited_cleanly(status: int | None) -> bool:
    """Whether a wait status is a normal exit with code 0."""
    return status is not None and status & 0x7F == 0 and (status >> 8) & 0xFF == 0


def _stat_fields(pid: int) -> list[str] | None:
    """``stat`` after the command name: state, ppid, … (index 0 = field 3)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _comm(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.index("(") + 1 : stat.rindex(")")]


def _cmdline(pid: int) -> list[bytes]:
    """argv from ``/proc``; empty for a zombie or a process whose memory is
    already released on its way out."""
    try:
        data = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return data.split(b"\0") if data else []


def stubs_of(root_pid: int) -> dict[int, Stub]:
    """The Python-backend stubs among ``root_pid``'s descendants (zombies
    included), read from ``/proc``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found: dict[int, Stub] = {}
    todo = list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        fields = _stat_fields(pid)
        if fields is None:
            continue
        argv = _cmdline(pid)
        zombie = fields[0] in ("Z", "X")
        # A zombie's cmdline is empty (its instance name is remembered from
        # earlier polls); its command name, cut to 15 characters, remains.
        # So is the cmdline of a process that is exiting but not yet a zombie
        # (its memory is gone first): still a stub, or a polling watchdog that
        # lands in that moment would take a crash for a reaped stub and lose
        # its signal.
        is_stub = bool(argv and argv[0].endswith(STUB_BINARY.encode())) or (
            not argv and _comm(pid) == STUB_BINARY[:15]
        )
        instance = argv[8].decode("utf-8", "replace") if len(argv) > 8 and is_stub else ""
        status = int(fields[49]) if zombie and len(fields) > 49 else None
        if is_stub:
            found[pid] = Stub(pid, instance, zombie, status)
    return found


class StubWatchdog:
    """Polls a started ``Server`` every ``interval_s`` seconds on a daemon
    thread; on a dead stub or a dead server it records an ``Incident``, calls
    ``on_incident`` and (``recover=True``) restarts the server on the same
    ports. ``check()`` runs one poll synchronously (callers that just saw a
    request fail use it so as not to wait for the next tick)."""

    def __init__(
        self,
        server: Any,
        *,
        interval_s: float = 0.5,
        recover: bool = True,
        on_incident: Callable[[Incident], None] | None = None,
        restart_timeout_s: float = 300.0,
        restart_dead_server: bool = True,
        fallback: Mapping[str, tuple[str, ...]] | None = None,
        frozen_s: float = heartbeat.FROZEN_S,
    ) -> None:
        self.server = server
        # a stub whose heartbeat is older than this is frozen (trtspec.runtime.heartbeat)
        self.frozen_s = frozen_s
        # {model: variants}: a dead stub of one of these leaves its variants down
        # instead of restarting the server (manifest.fallback_covered).
        self.fallback = dict(fallback or {})
        self.down: dict[str, Incident] = {}  # variant -> the crash that took it down
        # False: a server that exited is its owner's business (`trtspec serve`
        # ends with the log tail); only dead stubs are handled here.
        self.restart_dead_server = restart_dead_server
        self.interval_s = interval_s
        self.recover = recover
        self.on_incident = on_incident
        self.restart_timeout_s = restart_timeout_s
        self.incidents: list[Incident] = []
        self._known: dict[int, Stub] = {}
        self._killed: set[int] = set()  # frozen stubs this watchdog killed
        self._server_pid: int | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failed: ServerError | None = None  # a restart that did not work

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> StubWatchdog:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="trtspec-watchdog", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.restart_timeout_s + 10)

    def __enter__(self) -> StubWatchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(ServerError):
                self.check()

    # -- one poll ----------------------------------------------------------
    def check(self) -> list[Incident]:
        """Look once; handle and return the new incidents."""
        with self._lock:
            if self._stop.is_set() and self._thread is not None:
                return []
            found = self._find()
            # the deaths that restart the server first: a restart brings back
            # every variant, so none of this poll is then reported as down
            found.sort(key=self._leaves_down)
            restarted = False
            for incident in found:
                if restarted and incident.kind in STUB_DEATHS:
                    # Several stubs of one server found dead in one poll (a
                    # kill of the group, the OOM killer's round): the restart
                    # the first one caused replaced them all. Another restart
                    # per stub would only take the server down again.
                    self._covered(incident)
                    continue
                restarted = self._handle(incident) or restarted
            return found

    def _find(self) -> list[Incident]:
        server = self.server
        pid = server.pid
        if pid is None:
            return []
        if pid != self._server_pid:  # started or restarted: a fresh set of stubs
            self._server_pid, self._known = pid, {}
        exited = self._server_exit(pid)
        if exited is not None:
            return exited
        now = stubs_of(pid)
        self._killed &= set(now)  # reaped: the pid may be reused
        found = []
        for stub_pid, stub in now.items():
            known = self._known.get(stub_pid)
            if stub_pid in self._killed:
                continue  # reported as frozen when it was killed
            if stub.zombie:
                if exited_cleanly(stub.wait_status):
                    # A stub ends with code 0 when its model is unloaded or
                    # the server shuts down: that is no crash.
                    self._known[stub_pid] = Stub(stub_pid, stub.instance, True, stub.wait_status)
                    continue
                if known is None or not known.zombie:  # unknown: died before we looked
                    found.append(
                        Incident(
                            "stub_crash",
                            known.model if known else None,
                            stub_pid,
                            describe_wait_status(stub.wait_status),
                        )
                    )
                    self._known[stub_pid] = Stub(
                        stub_pid, known.instance if known else "", True, stub.wait_status
                    )
            elif stub.instance:
                self._known[stub_pid] = stub
                frozen = self._frozen(stub)
                if frozen is not None:
                    found.append(frozen)
        for stub_pid, known in list(self._known.items()):
            if stub_pid not in now and not known.zombie:  # reaped already
                found.append(Incident("stub_crash", known.model, stub_pid, "exited"))
                del self._known[stub_pid]
        if found:  # stubs leave when their server dies: then it is the server's death
            for _ in range(5):  # (children are reparented a moment before the exit shows)
                exited = self._server_exit(pid)
                if exited is not None:
                    return exited
                time.sleep(0.05)
        return found

    def _frozen(self, stub: Stub) -> Incident | None:
        """A live stub whose heartbeat stopped ``frozen_s`` ago: killed here
        (SIGKILL: nothing of it runs any more), remembered as killed so that
        its zombie is not reported again, and returned as the incident."""
        folder = getattr(self.server, "heartbeat_dir", None)
        if folder is None:
            return None
        age = heartbeat.age(Path(folder), stub.pid)
        if age is None or age < self.frozen_s:
            return None
        with contextlib.suppress(ProcessLookupError):
            os.kill(stub.pid, signal.SIGKILL)
        heartbeat.forget(Path(folder), stub.pid)
        self._killed.add(stub.pid)
        self._known.pop(stub.pid, None)
        return Incident(
            "stub_frozen",
            stub.model,
            stub.pid,
            f"stopped running Python {age:.0f} s ago (its heartbeat stopped: the "
            "tritonserver 2.51 stub deadlock of docs/design/triton-limits.md) and was killed",
        )

    def _server_exit(self, pid: int) -> list[Incident] | None:
        code = self.server.poll()
        if code is None:
            return None
        if not self.restart_dead_server:
            return []
        cause = describe_wait_status(-code & 0x7F) if code < 0 else f"exited with code {code}"
        return [Incident("server_exit", None, pid, cause)]

    def _handle(self, incident: Incident) -> bool:
        """Record, act on and report ``incident``; True when it restarted the server."""
        restarted = False
        self.incidents.append(incident)
        variants = self.fallback.get(incident.model or "") if incident.kind in STUB_DEATHS else None
        if variants and self.server.poll() is None:
            # The router fails over: a restart would fail every request in
            # flight on every variant and refuse new ones for its duration.
            down_dir = getattr(self.server, "down_dir", None)
            for variant in variants:
                self.down.setdefault(variant, incident)
                if down_dir is not None:
                    mark_down(down_dir, variant)  # the router reads it per request
            names = ", ".join(repr(v) for v in variants)
            incident.action = (
                f"{'variant' if len(variants) == 1 else 'variants'} {names} "
                f"{'stays' if len(variants) == 1 else 'stay'} down: the router sends "
                f"{'its' if len(variants) == 1 else 'their'} routes to their fallback "
                "until tritonserver restarts"
            )
            incident.recovered = False
            incident.recovery_s = 0.0
        elif self.recover:
            start = time.monotonic()
            try:
                # A server with a dead stub has nothing worth a graceful exit.
                self.server.restart(timeout=self.restart_timeout_s, grace=1.0)
            except ServerError as exc:
                incident.action = "tritonserver restart failed"
                incident.error = str(exc)
                self.failed = exc
            else:
                incident.action = "tritonserver restarted on the same ports"
                incident.recovered = restarted = True
                self.down.clear()  # every variant is back (restart() cleared the marks)
                self._server_pid, self._known = self.server.pid, {}
                self._seed()
            incident.recovery_s = time.monotonic() - start
        incident.done_ns = time.perf_counter_ns()
        if self.on_incident is not None:
            self.on_incident(incident)
        return restarted

    def _leaves_down(self, incident: Incident) -> bool:
        """Whether ``incident`` would only mark variants down (no restart)."""
        return incident.kind in STUB_DEATHS and bool(self.fallback.get(incident.model or ""))

    def _covered(self, incident: Incident) -> None:
        """Record a stub death that the restart for an earlier incident of the
        same poll already recovered from."""
        self.incidents.append(incident)
        incident.action = "recovered by the same tritonserver restart"
        incident.recovered = True
        incident.recovery_s = 0.0
        incident.done_ns = time.perf_counter_ns()
        if self.on_incident is not None:
            self.on_incident(incident)

    def _seed(self) -> None:
        """Learn the fresh server's stubs now, so one that dies before the
        next tick is still recognised by its pid."""
        pid = self.server.pid
        if pid is not None:
            self._known = {p: s for p, s in stubs_of(pid).items() if s.instance and not s.zombie}

    def prime(self) -> StubWatchdog:
        """Learn the current stubs (call after ``Server.start``)."""
        with self._lock:
            self._server_pid = self.server.pid
            self._seed()
        return self

    def check_alive(self) -> None:
        """``Server.check_alive`` between restarts (never in the middle of one)."""
        with self._lock:
            self.server.check_alive()

    def incidents_since(self, time_ns: int) -> list[Incident]:
        """The incidents a request sent at ``time_ns`` (``perf_counter_ns``)
        may have run into: found after it was sent, or still being recovered
        from (or recovered from only after) when it was sent."""
        with self._lock:
            return [
                i
                for i in self.incidents
                if i.time_ns >= time_ns or i.done_ns is None or i.done_ns >= time_ns
            ]

    def note(self, incident: Incident) -> Incident:
        """Record an incident someone else found (a stub that stopped
        answering without dying) and recover from it like the others."""
        with self._lock:
            self._handle(incident)
        return incident
