"""Helpers the decoupled Python models (orchestrator, router) share: one daemon
thread per request, so a long generation does not block the requests queued
behind it, joined at unload; and the config's string parameters as a dict.
No Triton imports: unit-testable as is."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


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
