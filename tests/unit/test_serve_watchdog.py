"""The stub watchdog's /proc reading and incident handling, on real processes:
a stand-in stub (a Python process started under the name ``triton_python_backend_stub``
with a stub's argv, a child of this test process) is killed with a real
SIGSEGV; the watchdog must name the model and the signal and restart the
"server" (this process: a recorder of restart calls, since what is under test
here is the detection; tests/integration/test_serve_watchdog.py does it with
tritonserver). Also: stale shared-memory regions of dead owners."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trtspec.runtime import heartbeat
from trtspec.runtime.health import is_down
from trtspec.serve.manifest import fallback_covered
from trtspec.serve.supervisor import remove_stale_shm_regions
from trtspec.serve.watchdog import Stub, StubWatchdog, describe_wait_status, stubs_of


class ThisProcess:
    """The watchdog's view of a server: a pid whose children are the stubs."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.restarts = 0

    def poll(self) -> int | None:
        return None

    def restart(self, timeout: float, grace: float) -> None:
        self.restarts += 1


def _wait_until_seen(server: ThisProcess, pid: int) -> None:
    """Until ``pid`` is among ``server``'s stubs (it has exec'd), 10 s at most."""
    deadline = time.monotonic() + 10
    while pid not in stubs_of(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_wait_status_words() -> None:
    assert describe_wait_status(signal.SIGSEGV) == "was killed by SIGSEGV"
    assert describe_wait_status(signal.SIGKILL) == "was killed by SIGKILL"
    assert describe_wait_status(3 << 8) == "exited with code 3"


def test_a_stub_killed_by_sigsegv_is_an_incident_within_a_poll(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("import time\ntime.sleep(600)\n")
    # a stub's argv: model.py, shm region, sizes, parent pid, lib dir, ipc handle,
    # instance name (argv[8]), runtime
    # posix_spawn, not Popen: nothing in this process may reap the zombie before
    # the watchdog reads its wait status (tritonserver does not reap its stubs)
    # (and under the stub's file name: a zombie's command name is all that is left)
    binary = tmp_path / "triton_python_backend_stub"
    binary.symlink_to(sys.executable)
    pid = os.posix_spawn(
        binary,
        [
            f"{tmp_path}/triton_python_backend_stub",
            str(model),
            "region",
            "1",
            "1",
            "1",
            "lib",
            "1",
            "router_0_0",
            "DEFAULT",
        ],
        os.environ,
    )
    try:
        server = ThisProcess()
        seen = []
        _wait_until_seen(server, pid)
        found = stubs_of(server.pid)
        assert found[pid].model == "router", found
        with StubWatchdog(server, interval_s=0.1, on_incident=seen.append).prime() as dog:
            assert dog.check() == []  # a live stub is no incident
            os.kill(pid, signal.SIGSEGV)
            deadline = time.monotonic() + 10
            while not seen and time.monotonic() < deadline:
                time.sleep(0.02)
        assert len(seen) == 1, seen
        incident = seen[0]
        assert (incident.kind, incident.model, incident.pid) == ("stub_crash", "router", pid)
        assert incident.message() == (
            f"the Python-backend stub of model 'router' (pid {pid}) was killed by SIGSEGV; "
            "the requests in flight failed"
        )
        assert incident.recovered and incident.action == "tritonserver restarted on the same ports"
        assert server.restarts == 1
        assert dog.incidents_since(incident.time_ns - 1) == [incident]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _spawn_stub(tmp_path: Path, script: str, instance: str = "router_0_0") -> int:
    """A stand-in stub running ``script``, under the stub's file name and argv
    (model.py, shm region, sizes, parent pid, lib dir, ipc handle, instance
    name = argv[8], runtime), started with posix_spawn, not Popen: nothing in
    this process may reap the zombie before the watchdog reads its wait
    status (tritonserver does not reap its stubs)."""
    model = tmp_path / "model.py"
    model.write_text(script)
    binary = tmp_path / "triton_python_backend_stub"
    if not binary.exists():
        binary.symlink_to(sys.executable)
    argv = [str(binary), str(model), "region", "1", "1", "1", "lib", "1", instance, "DEFAULT"]
    return os.posix_spawn(binary, argv, os.environ)


def test_a_stub_that_exits_with_code_0_is_no_incident(tmp_path: Path) -> None:
    """A stub ends normally when its model is unloaded or the server shuts
    down; only a signal or a non-zero code is a crash (issue 28)."""
    pid = _spawn_stub(tmp_path, "import sys, time\ntime.sleep(1.0)\nsys.exit(0)\n")
    try:
        server = ThisProcess()
        seen: list = []
        _wait_until_seen(server, pid)
        dog = StubWatchdog(server, interval_s=0.1, on_incident=seen.append).prime()
        assert pid in dog._known
        deadline = time.monotonic() + 10
        while not stubs_of(server.pid).get(pid, Stub(0, "", False, None)).zombie:
            assert time.monotonic() < deadline, "the stand-in stub did not exit"
            time.sleep(0.05)
        assert stubs_of(server.pid)[pid].wait_status == 0
        assert dog.check() == [] and dog.check() == []
        assert seen == [] and server.restarts == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_stub_that_exits_with_code_1_is_a_crash(tmp_path: Path) -> None:
    pid = _spawn_stub(tmp_path, "import sys, time\ntime.sleep(1.0)\nsys.exit(1)\n")
    try:
        server = ThisProcess()
        _wait_until_seen(server, pid)
        dog = StubWatchdog(server, interval_s=0.1).prime()
        found: list = []
        deadline = time.monotonic() + 10
        while not found and time.monotonic() < deadline:
            found = dog.check()
            time.sleep(0.05)
        assert [(i.kind, i.model, i.cause) for i in found] == [
            ("stub_crash", "router", "exited with code 1")
        ]
        assert server.restarts == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _kill_and_wait_for_zombies(server: ThisProcess, pids: list[int]) -> None:
    """SIGKILL the stand-in stubs ``pids`` and wait (10 s at most) until every
    one is a zombie: one poll then finds them all dead at once."""
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not all(stubs_of(server.pid).get(p, Stub(0, "", False, None)).zombie for p in pids):
        assert time.monotonic() < deadline, "the stand-in stubs did not die"
        time.sleep(0.02)


def test_stubs_found_dead_in_one_poll_cost_one_restart(tmp_path: Path) -> None:
    """A kill of several stubs at once (the group, the OOM killer's round)
    restarts the server once: the rest of that poll's deaths are covered by
    it (before, each took the fresh server down again)."""
    first = _spawn_stub(tmp_path, "import time\ntime.sleep(600)\n")
    second = _spawn_stub(tmp_path, "import time\ntime.sleep(600)\n")
    pids = [first, second]
    try:
        server = ThisProcess()
        seen: list = []
        for pid in pids:
            _wait_until_seen(server, pid)
        dog = StubWatchdog(server, interval_s=0.1, on_incident=seen.append).prime()
        _kill_and_wait_for_zombies(server, pids)
        found = dog.check()
        assert sorted(i.pid for i in found) == sorted(pids)
        assert server.restarts == 1
        assert [i.action for i in found] == [
            "tritonserver restarted on the same ports",
            "recovered by the same tritonserver restart",
        ]
        assert all(i.recovered for i in found) and seen == found
        assert found[1].message().startswith("the Python-backend stub of model 'router'")
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@pytest.mark.parametrize("variant_first", [True, False])
def test_a_poll_restarts_first_so_no_variant_is_reported_down_after_it(
    tmp_path: Path, variant_first: bool
) -> None:
    """A covered variant's stub and the router's die together: the router's
    death restarts the server, which brings the variant back too, so the
    variant's death is reported as covered by that restart, whatever order
    the poll found them in (before: "stays down" when it came first)."""
    names = ["ngram_0_0", "router_0_0"] if variant_first else ["router_0_0", "ngram_0_0"]
    pids = [_spawn_stub(tmp_path, "import time\ntime.sleep(600)\n", name) for name in names]
    try:
        server = ThisProcess()
        server.down_dir = tmp_path / "down"  # type: ignore[attr-defined]
        seen: list = []
        for pid in pids:
            _wait_until_seen(server, pid)
        dog = StubWatchdog(
            server, interval_s=0.1, on_incident=seen.append, fallback={"ngram": ("ngram",)}
        ).prime()
        _kill_and_wait_for_zombies(server, pids)
        found = dog.check()
        assert [(i.model, i.action) for i in found] == [
            ("router", "tritonserver restarted on the same ports"),
            ("ngram", "recovered by the same tritonserver restart"),
        ]
        assert server.restarts == 1 and dog.down == {} and all(i.recovered for i in seen)
        assert not is_down("ngram", server.down_dir)  # type: ignore[attr-defined]
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def test_a_stub_caught_on_its_way_out_keeps_its_signal(tmp_path: Path, monkeypatch) -> None:
    """A process that is exiting but not yet a zombie has an empty cmdline
    (its memory goes first) and a state that is not Z. A poll landing in that
    moment used to miss the stub, take it for reaped and report a SIGKILL as
    "exited" (seen once in CI). The stub must still be seen, and the signal
    reported once it is a zombie."""
    from trtspec.serve import watchdog

    pid = _spawn_stub(tmp_path, "import time\ntime.sleep(600)\n")
    try:
        server = ThisProcess()
        _wait_until_seen(server, pid)
        dog = StubWatchdog(server, interval_s=0.1).prime()
        real = watchdog._cmdline
        monkeypatch.setattr(watchdog, "_cmdline", lambda p: [] if p == pid else real(p))
        # the window, held open: alive (state S), cmdline empty
        assert stubs_of(server.pid)[pid] == Stub(pid, "", False, None)
        assert dog.check() == [] and server.restarts == 0
        os.kill(pid, signal.SIGKILL)
        found: list = []
        deadline = time.monotonic() + 10
        while not found and time.monotonic() < deadline:
            found = dog.check()
            time.sleep(0.05)
        assert [(i.model, i.cause) for i in found] == [("router", "was killed by SIGKILL")]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_stale_regions_of_dead_owners_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    names = [
        f"trtspec_{dead.pid}_0badc0de_router_0_0",
        f"trtspec_{os.getpid()}_0badc0de_x",
        "someone_else_region",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert remove_stale_shm_regions(tmp_path) == [names[0]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "repo" / "vicuna-7b"


def test_fallback_covered_is_what_only_speculative_variants_use(tmp_path: Path) -> None:
    """Issue 28: a crash in a model only speculative variants use is covered
    by the router's fallback; the router, the fallback's closure (baseline:
    preprocessing, postprocessing, target) and everything of a route's
    fallback variant are not."""
    covered = fallback_covered(GOLDEN)
    assert covered == {
        "draft": ("draft",),
        "draft_vicuna-68m": ("draft",),
        "target_dte": ("draft", "ngram"),
        "ngram": ("ngram",),
        "eagle": ("eagle",),
        "target_eagle_eagle": ("eagle",),
        "lookahead": ("lookahead",),
        "target_lookahead_lookahead": ("lookahead",),
        "medusa": ("medusa",),
        "target_medusa_medusa": ("medusa",),
    }
    # serving one variant alone (no router): nothing falls back, a crash restarts
    assert fallback_covered(GOLDEN, ["ngram", "target_dte", "preprocessing"]) == {}
    # a route whose fallback is ngram makes ngram's closure essential
    repo = tmp_path / "repo"
    shutil.copytree(GOLDEN, repo)
    (repo / "router" / "routing.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "default_variant": "baseline",
                "routes": {"r": {"variant": "draft", "fallback_variant": "ngram"}},
            }
        )
    )
    covered = fallback_covered(repo)
    assert "ngram" not in covered and "target_dte" not in covered
    assert covered["draft_vicuna-68m"] == ("draft",)


def test_a_covered_stub_crash_leaves_its_variant_down_without_a_restart(
    tmp_path: Path,
) -> None:
    pid = _spawn_stub(tmp_path, "import time\ntime.sleep(600)\n")
    try:
        server = ThisProcess()
        seen: list = []
        _wait_until_seen(server, pid)
        server.down_dir = tmp_path / "down"  # type: ignore[attr-defined]
        # the stand-in is named router_0_0: cover "router" as if it were a variant's
        dog = StubWatchdog(
            server, interval_s=0.1, on_incident=seen.append, fallback={"router": ("ngram",)}
        ).prime()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            dog.check()
            time.sleep(0.05)
        assert server.restarts == 0
        [incident] = seen
        assert incident.action == (
            "variant 'ngram' stays down: the router sends its routes to their fallback until "
            "tritonserver restarts"
        )
        assert incident.message() == (
            f"the Python-backend stub of model 'router' (pid {pid}) was killed by SIGKILL; "
            "requests already streaming from it may fail"
        )
        assert dog.down == {"ngram": incident} and not incident.recovered
        # what the router reads per request (trtspec.runtime.health)
        assert is_down("ngram", tmp_path / "down") and not is_down("lookahead", tmp_path / "down")
        assert dog.check() == []  # the zombie is reported once
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_the_guard_removes_the_servers_private_folder(tmp_path: Path) -> None:
    """After its owner died, the guard removes the server's private folder
    (repository view, cancellation flags) without following the view's
    symlinks into the repository; a folder not named by Server is left."""
    from trtspec.serve import guard

    repo_model = tmp_path / "repo" / "m"
    repo_model.mkdir(parents=True)
    (repo_model / "config.pbtxt").write_text("x")
    folder = tmp_path / "trtspec-server-1-abc"
    (folder / "repository").mkdir(parents=True)
    (folder / "repository" / "m").symlink_to(repo_model)
    (folder / "cancel").mkdir()
    guard.clean("", set(), 0.0, str(folder))
    assert not folder.exists()
    assert (repo_model / "config.pbtxt").read_text() == "x"
    other = tmp_path / "precious"
    other.mkdir()
    guard.clean("", set(), 0.0, str(other))
    assert other.is_dir()


FREEZING_STUB = """\
import ctypes
import os
import pathlib
import time

from trtspec.runtime import heartbeat

assert heartbeat.start(interval_s=0.05)  # from $TRTSPEC_HEARTBEAT_DIR, as a model does
while not pathlib.Path({go!r}).exists():
    time.sleep(0.02)
# What the 2.51 stub's deadlock leaves: a thread that holds the GIL, blocked in C
# for good (PyDLL keeps the GIL over the call), so no Python runs again.
ctypes.PyDLL(None).pause()
"""


def test_a_frozen_stub_is_killed_and_recovered_from(tmp_path: Path, monkeypatch) -> None:
    """A stub whose Python stops running (its heartbeat file ages) is killed
    and handled as a crash of kind stub_frozen; while it beats, and for a
    stub that never beat, nothing happens; its zombie is not reported again."""
    beats = tmp_path / "heartbeat"
    beats.mkdir(mode=0o700)
    go = tmp_path / "freeze-now"
    monkeypatch.setenv("TRTSPEC_HEARTBEAT_DIR", str(beats))
    # the stand-in runs the interpreter under another name, outside the venv
    monkeypatch.setenv("PYTHONPATH", str(Path(heartbeat.__file__).parents[2]))
    pid = _spawn_stub(tmp_path, FREEZING_STUB.format(go=str(go)))
    silent_dir = tmp_path / "silent"
    silent_dir.mkdir()
    silent = _spawn_stub(silent_dir, "import time\ntime.sleep(600)\n")  # never beats
    try:
        server = ThisProcess()
        server.heartbeat_dir = beats  # type: ignore[attr-defined]
        seen: list = []
        _wait_until_seen(server, pid)
        _wait_until_seen(server, silent)
        deadline = time.monotonic() + 30
        while not (beats / str(pid)).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        dog = StubWatchdog(server, on_incident=seen.append, frozen_s=1.5).prime()
        for _ in range(5):  # beating (and silent): alive
            assert dog.check() == []
            time.sleep(0.2)
        go.touch()
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            dog.check()
            time.sleep(0.1)
        [incident] = seen
        assert (incident.kind, incident.model, incident.pid) == ("stub_frozen", "router", pid)
        assert incident.cause.startswith("stopped running Python ")
        assert incident.cause.endswith("and was killed")
        assert incident.message().startswith(
            f"the Python-backend stub of model 'router' (pid {pid})"
        )
        assert incident.recovered and server.restarts == 1
        # killed: a zombie by SIGKILL, which the watchdog does not report again
        deadline = time.monotonic() + 10
        while not stubs_of(server.pid)[pid].zombie and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stubs_of(server.pid)[pid].wait_status == signal.SIGKILL
        assert not (beats / str(pid)).exists()
        assert dog.check() == [] and len(dog.incidents) == 1
        assert not stubs_of(server.pid)[silent].zombie  # never beat: never judged
    finally:
        for p in (pid, silent):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
            os.waitpid(p, 0)
