"""Atomic file writes shared by every stage.

A reader (a later build step, tritonserver, `trtspec report`) must see either
the old file or the new one, never half of one: each writer here fills a temp
file in the same folder and ``os.replace``s it into place. The file gets the
mode an ordinary ``open()`` would give (``0o666`` less the umask), not the
``0o600`` of ``mkstemp``, so a repository built by one user can be served by
another. A failure (full disk, read-only folder) removes the temp file and
raises an ``OSError`` naming the destination, which the CLI reports as an
expected error (``trtspec.errors.os_error``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process umask, read without changing it (``os.umask`` can only be
    read by setting it, which races with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # no /proc: the only other way to read it
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode ``open()`` gives a new file: ``0o666`` less the umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode ``mkdir()`` gives a new folder: ``0o777`` less the umask."""
    return 0o777 & ~current_umask()


def make_staging_dir(prefix: str, parent: Path) -> Path:
    """A new temp folder in ``parent`` (to fill, then rename into place) with
    the mode ``mkdir()`` would give it, not ``mkdtemp``'s ``0o700``."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    os.chmod(staging, dir_mode())
    return staging


def _named(exc: OSError, path: Path) -> OSError:
    """``exc`` re-raised against ``path`` (a failed write() names no file)."""
    return OSError(exc.errno, exc.strerror, str(path))


def atomic_write_bytes(path: Path, data: bytes, *, fsync: bool = False) -> None:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # names the folder it could not make
        raise _named(exc, Path(exc.filename or path.parent)) from exc
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # would name the random temp file
        raise _named(exc, path) from exc
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), file_mode())
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise _named(exc, path) from exc
        raise


def atomic_write_text(path: Path, text: str, *, fsync: bool = False) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_write_json(path: Path, data: Any, *, fsync: bool = False) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n", fsync=fsync)
