"""Which variants of a running server are down, as the router sees it.

When a Python-backend stub that only speculative variants use dies, the stub
watchdog (``trtspec.serve.watchdog``) leaves the server running and marks
each of those variants down: an empty file named after the variant in the
server's private folder (``$TRTSPEC_VARIANTS_DOWN``, set by
``trtspec.serve.Server``; mode 0700, owned by the server's user). The router
sends a route whose variant is down straight to the route's fallback —
without it, a request sent to the dead model waits in Triton's queue for its
BLS deadline (probed on 2.51: the model stays "ready" and its queue stalls
once its stub died mid-request); and a request already waiting on it
(``watch``) ends at once. A restart clears the folder.

Stdlib only: imported inside the Triton stub.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

DOWN_ENV = "TRTSPEC_VARIANTS_DOWN"


def _folder() -> Path | None:
    value = os.environ.get(DOWN_ENV)
    return Path(value) if value else None


def is_down(variant: str, folder: Path | None = None) -> bool:
    """Whether the watchdog marked ``variant`` down (one ``stat``)."""
    folder = folder or _folder()
    if folder is None or not variant or "/" in variant or variant.startswith("."):
        return False
    return (folder / variant).exists()


def watch(variant: str, folder: Path | None = None) -> Callable[[], str | None]:
    """For a wait on ``variant`` (``threads.CalleeDown``): None while it is
    up, why it will not answer once the watchdog marked it down. A request
    already in flight on a dead stub then ends at once instead of at its
    deadline (probed on 2.51: 62-70 s for a killed ``target_dte``)."""

    def down() -> str | None:
        if not is_down(variant, folder):
            return None
        return (
            f"variant {variant!r} went down while answering (a stub it runs on died; "
            "the stub watchdog marked it down)"
        )

    return down


def mark_down(folder: Path, variant: str) -> None:
    """Mark ``variant`` down (the watchdog; best effort)."""
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, exist_ok=True)
        (folder / variant).touch()


def clear(folder: Path) -> None:
    """Remove every file of one of the server's private flag folders (after
    a restart every stub is new: no variant is down, no heartbeat is old);
    best effort."""
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            with contextlib.suppress(OSError):
                entry.unlink()
