"""Client cancellation through a chain of Python models (router → orchestrator
→ engine), on the Triton 2.51 that nvidia-pytriton bundles.

Triton marks a request cancelled when its client cancels the gRPC stream, and
a decoupled model sees that through ``response_sender.is_cancelled()``. A BLS
callee never does on 2.51: its python_backend has no way to cancel a BLS
request (the response iterator's ``cancel()`` came with python_backend PR
#398, March 2025), so the callee of a cancelled caller would run to the end.
So the first model of a chain mints a token and passes it down as the BLS
request parameter ``trtspec_cancel``; every model of the chain asks its
``Cancellation`` between steps, which checks its own sender and a flag file
named by the token; the model that sees its own client cancel raises the flag,
and every model below stops at its next step. The raiser removes the flag when
its own request ends (its callees have answered by then). Where the iterator
has ``cancel()`` (newer Triton: the GPU container) it is called as well, which
reaches the C++ ``tensorrtllm`` backend that cannot read our flag.

No Triton imports: unit-testable as is.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import Any

from trtspec.procutil import unique_id

PARAMETER = "trtspec_cancel"
# How often a served model asks at most (seconds): Triton's
# ``is_cancelled()`` is a round trip to the server and the flag a ``stat``,
# and a model asks between steps, i.e. for every streamed token. A cancel is
# then seen within this long, at the first step after it.
POLL_S = 0.02


# Set by ``trtspec.serve.Server`` for its tritonserver: a folder it made with
# mkdtemp (private, unpredictable name), so no other user can pre-create it.
DIR_ENV = "TRTSPEC_CANCEL_DIR"
_TRIES = 16
_resolved: dict[str, Path] = {}


def is_private(folder: Path) -> bool:
    """Whether ``folder`` is a real folder (not a link) owned by this user
    and closed to everyone else (mode 0700 or stricter)."""
    try:
        st = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _private(folder: Path) -> bool:
    """Make ``folder`` (mode 0700) unless it exists; whether it is ours and private."""
    with contextlib.suppress(FileExistsError, OSError):
        folder.mkdir(mode=0o700)
    return is_private(folder)


def flag_dir() -> Path:
    """Where the flags live: ``$TRTSPEC_CANCEL_DIR`` (the server's own
    folder), else ``$TMPDIR/trtspec-cancel-<uid>``, shared by every stub of
    every server this user runs (tokens are random, so servers never clash).
    The folder must be a private folder of this user: one another user made
    first (to read or silence our flags) is passed over for the next name,
    ``…-<uid>-1``, ``-2`` … — every model of a chain passes over the same
    ones, so they still agree. Resolved once per process."""
    base = os.environ.get(DIR_ENV) or str(
        Path(tempfile.gettempdir()) / f"trtspec-cancel-{os.getuid()}"
    )
    found = _resolved.get(base)
    if found is not None and is_private(found):
        return found
    for attempt in range(_TRIES):
        folder = Path(base if attempt == 0 else f"{base}-{attempt}")
        if _private(folder):
            _resolved[base] = folder
            return folder
    # Every name taken by someone else: a folder nobody can use; raising a
    # flag then fails (cancellation stops only the model that saw the cancel).
    return Path(base) / "not-private"


def _token_of(request: Any) -> str | None:
    try:
        raw = request.parameters()
    except Exception:  # an object without parameters(): no token travels
        return None
    try:
        params = json.loads(raw) if isinstance(raw, str) and raw else {}
    except ValueError:
        return None
    token = params.get(PARAMETER) if isinstance(params, dict) else None
    if isinstance(token, str) and token.isalnum() and len(token) <= 64:
        return token
    return None


class Cancellation:
    """One request's cancellation as one model sees it. ``source`` is what
    Triton reports the client's cancel on (the response sender of a decoupled
    model, or the request itself); ``token`` comes from the caller (``None``:
    this model heads the chain and mints one)."""

    def __init__(self, source: Any, token: str | None = None, *, poll_s: float = 0.0) -> None:
        self.source = source
        # 0: ask every time (what a test wants); models pass ``POLL_S``
        self.poll_s = poll_s
        # The first ask waits a period too: it is a round trip to the server
        # (~0.2 ms on two cores), and a model's first check comes right before
        # its first token, which would wait for it (benchmarks/ceiling.py).
        self._next_poll = time.monotonic() + poll_s if poll_s > 0 else 0.0
        # A token handed down means the caller is a model of the chain (BLS),
        # not a client: what it can receive differs on 2.51 (orchestrator).
        self.from_caller = token is not None
        self.token = token or unique_id()
        self._cancelled = False
        self._raised = False
        # the flag's path, resolved at the first read (flag_dir() checks the
        # folder and builds Paths: ~0.2 ms of a stub's CPU cold, per poll)
        self._flag_path: str | None = None

    @classmethod
    def of(cls, request: Any, source: Any, *, poll_s: float = 0.0) -> Cancellation:
        return cls(source, _token_of(request), poll_s=poll_s)

    @property
    def flag(self) -> Path:
        return flag_dir() / self.token

    def parameters(self) -> dict[str, str]:
        """The BLS request parameters that carry this request's token down."""
        return {PARAMETER: self.token}

    def is_cancelled(self) -> bool:
        """Whether the client went away: this model's own client (then the
        flag is raised for the models below) or a caller's (the flag is up).
        With ``poll_s`` it asks at most once per ``poll_s`` seconds, the first
        time ``poll_s`` after this object was made, and answers ``False`` in
        between. A model below the head reads the flag only. Asking its own
        sender is a round trip to the server (~0.02–0.03 ms of the instant
        engine's CPU a token at 64 in flight in benchmarks/ceiling.py, where
        a poll falls on nearly every token). And it never says more than the
        flag: 2.51 does not tell a BLS callee of a cancel, and every caller
        that cancels a BLS stream (``cancel_stream``) has raised the flag
        first."""
        if self._cancelled:
            return True
        if self.poll_s > 0:
            now = time.monotonic()
            if now < self._next_poll:
                return False
            self._next_poll = now + self.poll_s
        if self.source is not None and not self.from_caller and self.source.is_cancelled():
            self._cancelled = True
            self.raise_flag()
        else:
            if self._flag_path is None:
                self._flag_path = str(self.flag)
            if os.path.exists(self._flag_path):
                self._cancelled = True
        return self._cancelled

    def raise_flag(self) -> None:
        """Tell the models below. Best effort: a flag folder this user cannot
        write (another user's, a full disk) leaves them running to their end,
        but never fails this model, which stops either way."""
        folder = flag_dir()
        if not is_private(folder):
            return  # never trust or write a folder someone else can touch
        try:
            (folder / self.token).touch()
        except OSError:
            return
        self._raised = True

    def close(self) -> None:
        """Remove the flag this model raised; call when its request has ended."""
        if self._raised:
            with contextlib.suppress(FileNotFoundError):
                self.flag.unlink()
            self._raised = False


def cancel_stream(responses: Any) -> None:
    """Cancel a BLS response stream where this Triton can (``cancel()`` on
    the iterator, python_backend ≥ r25.04); a no-op on 2.51."""
    cancel = getattr(responses, "cancel", None)
    if callable(cancel):
        cancel()


class Cancelled(Exception):
    """The request's client went away; the model stops and answers CANCELLED."""
