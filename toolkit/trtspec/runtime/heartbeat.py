"""A stub's heartbeat: proof, once a second, that its Python still runs.

Why: the Python backend of tritonserver 2.51 (python_backend r24.10, and
``main`` as of this writing) can deadlock a stub that makes decoupled BLS
calls from several threads (docs/design/triton-limits.md). Three locks form a
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
is unset (a server not started by ``trtspec.serve.Server`` or by
``trtspec deploy k8s``'s manifests) nothing runs.

Where no trtspec process watches the server (a Kubernetes pod runs
tritonserver itself), ``python3 -m trtspec.runtime.heartbeat DIR --live-url URL``
is the container's liveness probe: exit 1 when a live stub's beat is older
than ``--frozen-s`` or the URL does not answer 200, so the kubelet restarts
the container.

Stdlib only: imported inside the Triton stub.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
import time
import urllib.request
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
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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


def frozen(folder: Path, frozen_s: float = FROZEN_S) -> list[tuple[int, float]]:
    """``(pid, age)`` of every live process in ``folder`` whose beat is older
    than ``frozen_s`` (files of processes that are gone are not judged: a
    stub the Python backend restarted beats under its new pid)."""
    out = []
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            if not entry.name.isdigit() or not Path(f"/proc/{entry.name}").exists():
                continue
            seconds = age(folder, int(entry.name))
            if seconds is not None and seconds > frozen_s:
                out.append((int(entry.name), seconds))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    """The liveness check: 0 when every live stub beats (and ``--live-url``
    answers 200), 1 otherwise, with the reason on stderr."""
    p = argparse.ArgumentParser(
        prog="python3 -m trtspec.runtime.heartbeat",
        description="Liveness: fail when a Python-backend stub stopped beating.",
    )
    p.add_argument("folder", type=Path, help="the heartbeat folder ($TRTSPEC_HEARTBEAT_DIR)")
    p.add_argument("--frozen-s", type=float, default=FROZEN_S, help="oldest beat allowed")
    p.add_argument("--live-url", help="also require this URL to answer 200 (Triton's live)")
    args = p.parse_args(argv)
    stale = frozen(args.folder, args.frozen_s)
    if stale:
        pid, seconds = stale[0]
        print(
            f"stub pid {pid} last beat {seconds:.0f} s ago (over {args.frozen_s:g} s): frozen "
            "(the tritonserver Python-backend deadlock, trtspec docs/design/triton-limits.md)",
            file=sys.stderr,
        )
        return 1
    if args.live_url:
        try:  # an HTTP error status raises too (HTTPError is an OSError)
            with urllib.request.urlopen(args.live_url, timeout=3) as reply:
                status = reply.status
        except OSError as exc:
            print(f"{args.live_url}: {exc}", file=sys.stderr)
            return 1
        if status != 200:
            print(f"{args.live_url}: HTTP {status}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
