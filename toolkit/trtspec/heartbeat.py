"""A stub's heartbeat: proof, once a second, that its Python still runs.

Why: the Python backend of tritonserver 2.51 (python_backend r24.10, and
``main`` as of this writing) can deadlock a stub that makes decoupled BLS
calls from several threads (docs/internals.md §9). Three locks form a
cycle: a thread in ``ResponseIterator::Next`` wakes holding the iterator's
mutex and waits for the GIL; the stub's parent-message thread holds
``response_iterator_map_mu_`` and waits for that iterator's mutex to queue
the stream's next response; and a thread whose ``exec(decoupled=True)`` just
got its first response holds the GIL and waits for
``response_iterator_map_mu_`` (``Stub::GetResponseIterator``). The process
then sleeps for good with requests in flight: it does not die, so the
watchdog's look for dead stubs never sees it, and nothing written in
Python (deadlines, cancellation) runs again.

A frozen interpreter cannot say so, but it stops saying it is alive: a
daemon thread touches ``$TRTSPEC_HEARTBEAT_DIR/<pid>`` every ``INTERVAL_S``
(it needs the GIL for a moment each time), and the watchdog
(``trtspec.serve.watchdog``) kills a stub whose file is older than
``FROZEN_S`` so that its usual recovery runs. Models that call decoupled
BLS (router, orchestrators, LLM-API adapter) start it; where the variable
is unset (a server not started by ``trtspec.serve.Server``) nothing runs.

Stdlib only: imported inside the Triton stub.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

DIR_ENV = "TRTSPEC_HEARTBEAT_DIR"
INTERVAL_S = 1.0
# A live stub's beat is at most INTERVAL_S old plus its scheduling delay,
# which on two busy cores stays far below a second; a deadlocked stub's beat
# only ages. Ten seconds never mistakes one for the other.
FROZEN_S = 10.0

_started: set[int] = set()
_lock = threading.Lock()


def start(folder: str | os.PathLike[str] | None = None, interval_s: float = INTERVAL_S) -> bool:
    """Beat from a daemon thread of this process (once per process: later
    calls do nothing). Returns whether a heartbeat runs."""
    value = folder if folder is not None else os.environ.get(DIR_ENV)
    if not value:
        return False
    path = Path(value) / str(os.getpid())
    with _lock:
        if os.getpid() in _started:
            return True
        try:
            _beat(path)
        except OSError:
            return False  # a folder we cannot write: no heartbeat, no false alarm
        _started.add(os.getpid())
    thread = threading.Thread(
        target=_run, args=(path, interval_s), name="trtspec-heartbeat", daemon=True
    )
    thread.start()
    return True


def _beat(path: Path) -> None:
    try:
        os.utime(path)
    except FileNotFoundError:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)


def _run(path: Path, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        with contextlib.suppress(OSError):
            _beat(path)


def age(folder: Path, pid: int, now: float | None = None) -> float | None:
    """Seconds since ``pid`` last beat, or None when it never did (a model
    without a heartbeat, or a folder that is gone)."""
    try:
        mtime = (folder / str(pid)).stat().st_mtime
    except OSError:
        return None
    return max(0.0, (time.time() if now is None else now) - mtime)


def forget(folder: Path, pid: int) -> None:
    """Remove ``pid``'s file (its stub is gone)."""
    with contextlib.suppress(OSError):
        (folder / str(pid)).unlink()


def clear(folder: Path) -> None:
    """Remove every file (a restarted server's stubs are all new)."""
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            with contextlib.suppress(OSError):
                entry.unlink()
