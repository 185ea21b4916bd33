"""The exception types every library module raises for *expected* failures.

The CLI's single error boundary (``trtspec.cli._errors``) turns these into
``Error: …`` / ``Hint: …`` lines on stderr and an exit code; anything else is a
bug and shows a traceback only with ``TRTSPEC_DEBUG=1``.
"""

from __future__ import annotations


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
        head = self.issues[0] if len(self.issues) == 1 else (
            f"{len(self.issues)} problems in the spec:\n  " + "\n  ".join(self.issues)
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
