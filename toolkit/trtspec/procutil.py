"""Process facts shared by the build executor, the server supervisor and the
planner: stdlib only, so any stage can import it without pulling in another's
package."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.metadata
import itertools
import os
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


class _Ids:
    """``unique_id()``'s state: a random key per process (drawn again in a
    forked child) and a counter."""

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self.key = os.urandom(32)
        self.counter = itertools.count(1)
        self.lock = threading.Lock()

    def next(self) -> str:
        with self.lock:
            n = next(self.counter)
        return hashlib.blake2b(n.to_bytes(8, "little"), key=self.key, digest_size=16).hexdigest()


_IDS = _Ids()


def unique_id() -> str:
    """A 32-character hex id as unguessable as ``uuid.uuid4().hex`` (keyed
    BLAKE2b of a counter, the key random per process), without its
    ``getrandom`` system call per id: that call releases the GIL, and a served
    request's thread that lets go of the GIL before its first token waits for
    the stub's other threads to hand it back (~40 µs a call on two cores,
    benchmarks/ceiling.py). Unguessable matters: a cancellation token that
    could be predicted from another would let one client cancel another's
    request (``trtspec.runtime.cancel``)."""
    return _IDS.next()


def pid_alive(pid: int) -> bool:
    """True while a process with this pid exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``
    field 22): with the pid, a name no later process takes, although pids
    are reused (a restarted container's processes often get the same ones);
    None where it cannot be read (no such process, no ``/proc``) and for a
    process that has ended but is not reaped yet (a zombie: tritonserver does
    not reap its stubs)."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        if fields[0] in (b"Z", b"X"):  # field 3, the state: ended
            return None
        return int(fields[19])  # field 22; the split starts at field 3
    except (OSError, ValueError, IndexError):
        return None


def parent_death_hook(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to send ``sig`` to the child when the thread
    that forked it dies (``PR_SET_PDEATHSIG``), so a SIGKILLed trtspec leaves no
    orphan behind; ``None`` where prctl is unavailable. ``prctl`` is resolved
    here, before the fork: the child only calls it and takes no lock another
    thread could have held."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    signum = int(sig)
    return lambda: prctl(_PR_SET_PDEATHSIG, signum)


def dist_version(name: str) -> str | None:
    """An installed distribution's version (never imported), ``None`` if absent."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def skip_interpreter_teardown(code: int = 0) -> None:
    """End this process with ``code`` as soon as the interpreter starts to
    shut down (the first exit handler to run), skipping the module teardown.

    For a Triton Python-backend stub, called at the end of ``finalize``: the
    stub answers the finalize request, removes its shared memory and then
    runs ``Py_Finalize``, and tritonserver waits for the stub to exit before
    it counts the model unloaded. With torch and transformers imported, that
    teardown (thousands of modules and their objects freed one by one) takes
    1–2.5 s of CPU on two cores and nothing in it is ours to keep: our state
    was closed in ``finalize``. Registered last, it runs first (exit handlers
    run last-in first-out), after the interpreter has joined non-daemon threads.
    Only in a stub process: anywhere else (a test calling ``finalize`` on a
    model) it does nothing, so no exit status is ever replaced."""
    import atexit

    if not in_python_backend_stub():
        return

    def exit_now() -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        os._exit(code)

    atexit.register(exit_now)


STUB_BINARY = "triton_python_backend_stub"


def in_python_backend_stub() -> bool:
    """Whether this process is a Triton Python-backend stub (by its binary)."""
    try:
        return os.path.basename(os.readlink("/proc/self/exe")) == STUB_BINARY
    except OSError:
        return False
