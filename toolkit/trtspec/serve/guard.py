"""The guard process: stdlib only, run by path (``python -I guard.py PREFIX
GRACE [FOLDER]``) so that it starts in a few tens of milliseconds and imports nothing
of trtspec.

``Server`` starts one guard before its tritonserver and keeps the write end of
a pipe that is the guard's stdin. The guard blocks reading it; end-of-file
means the owner is gone — it closed the pipe after its own ``stop()``, or it
died (kill -9, an unhandled SIGTERM), and the kernel closed the pipe for it.
Then the guard SIGTERMs every process whose command line carries the
server's shared-memory prefix (tritonserver, ``mpirun`` and every
Python-backend stub: the stub's argv names its region, which starts with the
prefix) and every member of the process groups the owner announced
(``pgid N`` lines; ``gone N`` once it stopped that group itself), waits
``GRACE`` seconds, SIGKILLs what is left, unlinks ``/dev/shm/PREFIX*`` and removes FOLDER (the
server's private ``trtspec-server-…`` folder: repository view, cancel flags).
After a clean ``stop()`` there is nothing left and it exits at once. It
ignores SIGINT/SIGHUP/SIGTERM: a Ctrl-C aimed at the owner must not stop the
cleanup that would follow it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

SHM_DIR = "/dev/shm"


def matching(prefix: str, pgids: set[int]) -> list[int]:
    """Live pids whose argv mentions ``prefix`` or whose group is in ``pgids``."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            state, _ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
            if state in ("Z", "X"):
                continue
            hit = int(group) in pgids
            if not hit and prefix:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    hit = prefix.encode() in f.read()
        except (OSError, ValueError):
            continue
        if hit:
            out.append(int(entry))
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def clean(prefix: str, pgids: set[int], grace: float, folder: str = "") -> None:
    pids = matching(prefix, pgids)
    if pids:
        _signal(pids, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = matching(prefix, pgids)
        while pids:
            _signal(pids, signal.SIGKILL)
            time.sleep(0.05)
            pids = matching(prefix, pgids)
    if prefix and os.path.isdir(SHM_DIR):
        for name in os.listdir(SHM_DIR):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(SHM_DIR, name))
    # only a folder by the name Server gives it; symlinks inside are unlinked, not followed
    if folder and os.path.basename(folder).startswith("trtspec-server-"):
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    prefix, grace = argv[1], float(argv[2])
    folder = argv[3] if len(argv) > 3 else ""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    pgids: set[int] = set()
    stdin = sys.stdin.buffer
    for line in iter(stdin.readline, b""):
        word, _, value = line.decode("ascii", "replace").partition(" ")
        if word == "pgid" and value.strip().isdigit():
            pgids.add(int(value))
        elif word == "gone" and value.strip().isdigit():
            pgids.discard(int(value))
    clean(prefix, pgids, grace, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
