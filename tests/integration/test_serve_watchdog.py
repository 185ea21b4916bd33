"""Dead stubs and dead owners, through the real tritonserver (issue 10, D2/D5).

- A stub killed with SIGSEGV (what the 2.51 Python backend's heap corruption
  does) is noticed by the watchdog, the request in flight in it fails at once
  instead of waiting out its model, and the server serves again on the same
  ports. Then a stub that freezes (a thread holding the GIL for good, what
  the 2.51 stub's BLS deadlock leaves) is found by its stopped heartbeat,
  killed, and recovered from the same way.
- kill -9 (or SIGTERM) of the process that owns a ``Server``, at a random
  moment of its start, steady state or stop, leaves no tritonserver, no stub
  and no ``/dev/shm`` region behind (the guard process cleans up)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.integration.conftest import ADD_ONE, SLOW_INIT

pytestmark = pytest.mark.slow

SLOW_EXEC = """\
import pathlib
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pathlib.Path({marker!r}).touch()  # the test waits for this: the request is inside
        time.sleep(120)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.zeros(1, np.int32))])
                for _ in requests]
"""


FREEZE = """\
import ctypes
import pathlib

import triton_python_backend_utils  # noqa: F401  (first: it puts the venv on the path)

from trtspec.runtime import heartbeat


class TritonPythonModel:
    def initialize(self, args):
        heartbeat.start()  # as the router, orchestrators and adapter do

    def execute(self, requests):
        pathlib.Path({marker!r}).touch()
        ctypes.PyDLL(None).pause()  # keeps the GIL: no Python runs in this stub again
"""


def _infer(url: str, model: str, timeout: float = 200.0) -> tuple[Any, str | None]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(
        url, network_timeout=timeout, connection_timeout=timeout
    )
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([41], dtype=np.int32))
    try:
        return client.infer(model, [x]).as_numpy("Y"), None
    except Exception as exc:  # the error is what the test looks at
        return None, str(exc)
    finally:
        client.close()


def _call_until_inside(url: str, model: str, marker: Path) -> tuple[threading.Thread, dict]:
    """Send one request to ``model`` from a thread and return once the model
    touched ``marker`` (synchronised on the model's own signal, not on a
    guess of how long it takes): (the thread, what the call returns into)."""
    result: dict[str, Any] = {}

    def call() -> None:
        result["value"], result["error"] = _infer(url, model)
        result["at"] = time.monotonic()

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 120
    while not marker.exists() and caller.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), f"the request never reached model {model!r}: {result}"
    return caller, result


def test_watchdog_fails_in_flight_requests_and_serves_again(model_repo, start_server) -> None:
    from trtspec.serve import StubWatchdog, stubs_of

    repo = model_repo("crash")
    repo.add_python_model("addone", ADD_ONE)
    inside = repo.path.parent / "slow-is-executing"
    repo.add_python_model("slow", SLOW_EXEC.format(marker=str(inside)))
    frozen_inside = repo.path.parent / "freeze-is-executing"
    repo.add_python_model("freeze", FREEZE.format(marker=str(frozen_inside)))
    server = start_server(repo.path, models=["addone", "slow", "freeze"], timeout=180)
    ports = (server.http_port, server.grpc_port, server.metrics_port)
    seen = []
    with StubWatchdog(server, on_incident=seen.append, frozen_s=2.0).prime() as dog:
        caller, result = _call_until_inside(server.http_url, "slow", inside)
        stub = next(s for s in stubs_of(server.pid).values() if s.model == "slow")
        killed_at, killed_wall = time.monotonic(), time.time()
        os.kill(stub.pid, signal.SIGSEGV)
        caller.join(timeout=200)
        deadline = time.monotonic() + 200
        while not (seen and seen[0].recovery_s is not None) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert len(seen) == 1, seen
    incident = seen[0]
    assert (incident.kind, incident.model, incident.pid) == ("stub_crash", "slow", stub.pid)
    assert incident.cause == "was killed by SIGSEGV"
    assert incident.recovered, incident
    # noticed within seconds (0.5 s polls; generous for a loaded machine)
    assert incident.time - killed_wall < 10
    # the request in flight failed instead of waiting out its 120 s model
    assert result["value"] is None and result["error"], result
    assert result["at"] - killed_at < 100
    assert (server.http_port, server.grpc_port, server.metrics_port) == ports
    value, error = _infer(server.http_url, "addone")
    assert error is None and value.tolist() == [42]
    assert server.restarts == 1

    # a stub that freezes: alive, asleep for good, its heartbeat stopped
    beating = next(s.pid for s in stubs_of(server.pid).values() if s.model == "freeze")
    assert (server.heartbeat_dir / str(beating)).exists()  # it beats from initialize
    with dog.start():
        caller, frozen = _call_until_inside(server.http_url, "freeze", frozen_inside)
        stub = next(s for s in stubs_of(server.pid).values() if s.model == "freeze")
        caller.join(timeout=200)
        deadline = time.monotonic() + 200
        while not (len(seen) == 2 and seen[1].recovery_s is not None):
            assert time.monotonic() < deadline, seen
            time.sleep(0.1)
    incident = seen[1]
    assert (incident.kind, incident.model, incident.pid) == ("stub_frozen", "freeze", stub.pid)
    assert incident.recovered and server.restarts == 2, incident
    assert frozen["value"] is None and frozen["error"], frozen  # failed, not hung
    value, error = _infer(server.http_url, "addone")
    assert error is None and value.tolist() == [42]


OWNER = """\
import sys, threading, time
from trtspec.serve import Server

repo, phase, log, thread = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "thread"
models = ["slowinit"] if phase == "start" else ["addone"]
server = Server(repo, models=models, log_path=log)
print("prefix", server.shm_prefix, flush=True)
if thread:  # as a restart from a benchmark worker thread does
    starter = threading.Thread(target=server.start, kwargs={"timeout": 300}, daemon=True)
    starter.start()
    starter.join()
else:
    server.start(timeout=300)  # "start": the slow model holds it here for 60 s
print("ready", server.pid, flush=True)
if phase == "stop":
    print("stopping", flush=True)
    server.stop()
time.sleep(600)
"""


def _leftovers(prefix: str) -> tuple[list[int], list[str]]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if prefix.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state not in ("Z", "X"):
                    pids.append(int(entry))
        except OSError:
            continue
    regions = [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    return pids, regions


# (phase, signal, started from): kill -9 during start / steady / stop, SIGTERM in
# steady state; a server started from a thread other than the main one (the
# parent-death signal is tied to the thread that forked) during start and steady
TRIALS = [
    ("start", signal.SIGKILL, "main"),
    ("steady", signal.SIGKILL, "main"),
    ("stop", signal.SIGKILL, "main"),
    ("steady", signal.SIGTERM, "main"),
    ("start", signal.SIGKILL, "thread"),
    ("steady", signal.SIGKILL, "thread"),
]


@pytest.mark.parametrize("trial", TRIALS, ids=[f"{p}-{s.name}-{t}" for p, s, t in TRIALS])
def test_no_orphans_after_the_owner_dies(
    trial: tuple[str, signal.Signals, str], model_repo, triton_install, tmp_path: Path
) -> None:
    phase, sig, starter = trial
    repo = model_repo("owner")
    repo.add_python_model("addone", ADD_ONE)
    repo.add_python_model("slowinit", SLOW_INIT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(repo.path), phase, str(tmp_path / "server.log"), starter],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    rng = random.Random(f"{phase}-{sig}-{starter}")
    try:
        assert owner.stdout is not None
        prefix = owner.stdout.readline().split()[1]
        if phase == "start":
            # the slow model keeps the server in its start for 60 s: kill inside it,
            # once the server and the model's stub may both exist
            time.sleep(rng.uniform(1.0, 6.0))
        else:
            line = owner.stdout.readline()
            assert line.startswith("ready"), line
            if phase == "stop":
                assert owner.stdout.readline().startswith("stopping")
                time.sleep(rng.uniform(0.0, 0.5))
            else:
                time.sleep(rng.uniform(0.0, 2.0))
        os.kill(owner.pid, sig)
        owner.wait(timeout=30)
        deadline = time.monotonic() + 30
        left = _leftovers(prefix)
        while left != ([], []) and time.monotonic() < deadline:
            time.sleep(0.2)
            left = _leftovers(prefix)
        assert left == ([], []), f"left behind after {sig.name} in {phase}: {left}"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()
