"""The exception types every library module raises for *expected* failures.

The CLI's single error boundary (``trtspec.cli._errors``) turns these into
``Error: …`` / ``Hint: …`` lines on stderr and an exit code; anything else is a
bug and shows a traceback only with ``TRTSPEC_DEBUG=1`` — except the operating
system's own refusals (no space, read-only, permission denied), which
``os_error`` turns into expected errors naming the path and what to do.
"""

from __future__ import annotations

import errno
import getpass
import os


class TrtspecError(Exception):
    """An expected, user-fixable failure. ``hint`` says how to fix it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class SpecError(TrtspecError):
    """A build spec is invalid. ``issues`` holds every problem found, each
    already formatted as ``file:line:col: field.path: message``."""

    def __init__(self, issues: list[str], hint: str | None = None) -> None:
        self.issues = list(issues)
        head = (
            self.issues[0]
            if len(self.issues) == 1
            else (f"{len(self.issues)} problems in the spec:\n  " + "\n  ".join(self.issues))
        )
        super().__init__(head, hint)


class StepFailed(TrtspecError):
    """A build step's subprocess exited non-zero."""


class ServerError(TrtspecError):
    """tritonserver could not be found, started, or died."""


class RepoError(TrtspecError):
    """A Triton model repository is invalid."""


class BenchError(TrtspecError):
    """The benchmark could not run or its data is unreadable."""


class GateFailed(TrtspecError):
    """A benchmark finished but breached a ``--fail-on`` threshold."""

    exit_code = 3


class ArtifactError(TrtspecError):
    """A file an earlier stage writes is missing, unreadable, of another
    schema version, or written for another spec (``trtspec.artifacts``)."""


class FileSystemError(TrtspecError):
    """The operating system refused a read or write (full, read-only, no access)."""


_FULL = (errno.ENOSPC, errno.EDQUOT)
_DENIED = (errno.EACCES, errno.EPERM)


def os_error(exc: OSError) -> FileSystemError | None:
    """``exc`` as an expected error when the cause is the machine's, not a bug:
    a full disk or quota, a read-only file system, a permission refused.
    ``None`` for every other ``OSError``."""
    path = exc.filename2 if exc.filename2 is not None else exc.filename
    if exc.errno not in (*_FULL, errno.EROFS, *_DENIED):
        return None
    where = os.fspath(path) if path is not None else None
    folder = (os.path.dirname(where) or ".") if where else "the output folder"
    head = f"{where}: " if where else ""
    if exc.errno in _FULL:
        return FileSystemError(
            f"{head}no space left on the device",
            f"free space on that disk (see `df -h {folder}`) or write somewhere else; files "
            "trtspec finished before are complete (each one is replaced atomically)",
        )
    if exc.errno == errno.EROFS:
        return FileSystemError(
            f"{head}the file system is read-only",
            "write to a folder on a writable file system (pass another output folder)",
        )
    return FileSystemError(
        f"{head}permission denied",
        f"give user {_user()} access to {folder} (see `ls -ld {folder}`), or use another folder",
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())
