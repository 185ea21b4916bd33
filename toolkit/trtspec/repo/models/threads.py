"""Helpers the decoupled Python models (orchestrator, router) share: one daemon
thread per request, so a long generation does not block the requests queued
behind it, joined at unload; the config's string parameters as a dict; the
deadline of a streamed BLS call (from the request's ``max_tokens``); and
``BlsStreams``, which keeps finished decoupled-BLS response iterators alive
until the stub's own C++ thread has let go of them (the crash workaround
described there). No Triton imports: unit-testable as is."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from typing import Any

# Deadline of one streamed BLS call (a whole generation):
#   BLS_STREAM_BASE_S + BLS_STREAM_PER_TOKEN_S * max_tokens
# The base covers tokenization, queueing behind other requests and the first
# step; the per-token budget is the slowest decode step we accept (the CPU
# reference engine at concurrency 4 takes well under 0.5 s a token on the
# demo model). 128 tokens -> 286 s, where a flat 30 minutes used to apply.
BLS_STREAM_BASE_S = 30.0
# TRTSPEC_BLS_WORKAROUND=0 in the server's environment turns the crash
# workaround below off (benchmarks/soak_stubs.py --no-workaround: before/after).
WORKAROUND = os.environ.get("TRTSPEC_BLS_WORKAROUND", "1") != "0"
BLS_STREAM_PER_TOKEN_S = 2.0


def stream_timeout_us(max_tokens: int | None) -> int:
    """The BLS ``timeout`` (microseconds) of a stream that generates at most
    ``max_tokens`` tokens."""
    tokens = max(1, int(max_tokens or 1))
    return int((BLS_STREAM_BASE_S + BLS_STREAM_PER_TOKEN_S * tokens) * 1_000_000)


class BlsStreams:
    """Holds every decoupled-BLS response iterator for ``hold_s`` seconds after
    its caller is done with it, then drops it on this helper's own Python
    thread (with the GIL).

    Why: in the Python backend of tritonserver 2.51 (python_backend r24.10),
    a finished ``ResponseIterator`` is also referenced from the stub's
    ``response_iterator_map_``, which the stub's utils-message thread erases
    in ``Stub::SendCleanupId`` without holding the GIL. When that erase drops
    the last reference, ``~ResponseIterator`` frees every response and their
    ``PbTensor``s, whose NumPy arrays (made in ``PbTensor::LoadFromSharedMemory``)
    are then deallocated without the GIL — corrupting pymalloc while another
    thread builds a ``pb_utils.Tensor`` (the SIGSEGV seen in
    ``array_getbuffer <- PbTensor::FromNumpy``). python_backend #390 (r24.12 on)
    makes ``~PbTensor`` take the GIL. Keeping our own reference until the
    cleanup has long run makes Python's release the last one on 2.51 too."""

    def __init__(self, hold_s: float = 20.0) -> None:
        self.hold_s = hold_s
        self._held: collections.deque[tuple[float, Any]] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def keep(self, iterator: Any) -> None:
        """Keep ``iterator`` (and the responses it holds) for ``hold_s`` s."""
        if not WORKAROUND:
            return
        with self._lock:
            self._held.append((time.monotonic() + self.hold_s, iterator))
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._loop, name="trtspec-bls-release", daemon=True
                )
                self._thread.start()

    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _loop(self) -> None:
        while not self._closed:
            self._release(time.monotonic())
            self._wake.wait(0.5)

    def _release(self, now: float) -> None:
        while True:
            with self._lock:
                if not self._held or self._held[0][0] > now:
                    return
                _, iterator = self._held.popleft()
            del iterator  # dropped here, on a Python thread, with the GIL

    def close(self) -> None:
        """Drop everything now (model unload: the stub is going away)."""
        self._closed = True
        self._wake.set()
        self._release(float("inf"))


def string_params(config: dict[str, Any]) -> dict[str, str]:
    """A model config's ``parameters`` as plain strings."""
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


class RequestThreads:
    """Runs ``target(request)`` on its own daemon thread per request and keeps
    track of the live ones so ``join`` can wait for them at unload."""

    def __init__(self) -> None:
        self._threads: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, target: Callable[[Any], None], request: Any) -> None:
        def run() -> None:
            try:
                target(request)
            finally:
                with self._lock:
                    self._threads.discard(threading.current_thread())

        thread = threading.Thread(target=run, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def join(self, timeout: float = 10.0) -> None:
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=timeout)
