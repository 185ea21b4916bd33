"""The router's per-request log: one JSON line per request with exactly
``FIELDS``, written by a background thread from a bounded queue so a slow
disk never holds a request (a full queue drops the line and counts it in
``dropped``). To a size-bounded rotating file (``requests.jsonl``, rotated to
``.1`` … ``.backups``) or to stdout (a container's log collector). The
prompt's text is never logged unless the rollout's ``log.prompts`` asks
(then as ``prompt``, after the fixed fields). Stdlib-only.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
from pathlib import Path
from typing import Any, TextIO

# The fields of every line, in this order; null where a value is unknown.
FIELDS = (
    "route",
    "model",
    "speculative",
    "draft_model",
    "num_speculative_tokens",
    "temperature",
    "prompt_tokens",
    "completion_tokens",
    "ttft_ms",
    "latency_ms",
    "tokens_per_second",
    "accepted_tokens",
    "draft_tokens",
    "request_id",
    "variant",
    "arm",
    "fallback",
    "error",
)
# Besides FIELDS, only when asked (RolloutConfig.log.prompts); and the time.
OPTIONAL_FIELDS = ("prompt",)
TIME_FIELD = "time"

_STOP = object()


class LineWriter:
    """JSON lines to a rotating file or a stream, off the caller's thread."""

    def __init__(
        self,
        path: Path | None,
        *,
        max_bytes: int = 10 * 1024 * 1024,
        backups: int = 3,
        queue_size: int = 10000,
        stream: TextIO | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.max_bytes = max_bytes
        self.backups = backups
        self.stream = stream
        self.dropped = 0
        self.written = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._file: Any = None
        self._size = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="trtspec-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> bool:
        """Queue one line; False (and counted in ``dropped``) when the queue is full."""
        try:
            self._queue.put_nowait(record)
            return True
        except queue.Full:
            self.dropped += 1
            return False

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until what was queued so far is written (tests, shutdown)."""
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return
        done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            if isinstance(item, threading.Event):
                self._flush_out()
                item.set()
                continue
            try:
                line = json.dumps(item, separators=(",", ":"), default=str) + "\n"
                self._emit(line)
                self.written += 1
                if self._queue.empty():
                    self._flush_out()
            except (OSError, ValueError, TypeError) as exc:
                self.dropped += 1
                print(f"trtspec request log: {exc}", file=sys.stderr)
        self._flush_out()
        if self._file is not None:
            self._file.close()

    def _flush_out(self) -> None:
        try:
            if self._file is not None:
                self._file.flush()
            elif self.stream is not None:
                self.stream.flush()
        except (OSError, ValueError):
            pass

    def _emit(self, line: str) -> None:
        if self.path is None:
            (self.stream or sys.stdout).write(line)
            return
        data = line.encode("utf-8")
        if self._file is None:
            self._file = open(self.path, "ab")  # noqa: SIM115 (kept open; closed in _run)
            self._size = self._file.tell()
        if self._size and self._size + len(data) > self.max_bytes:
            self._rotate()
        self._file.write(data)
        self._size += len(data)

    def _rotate(self) -> None:
        assert self.path is not None
        self._file.close()
        self._file = None
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0


def log_files(path: Path) -> list[Path]:
    """``path`` and its rotated copies, oldest first."""
    path = Path(path)
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, *([path] if path.exists() else [])]


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every record of ``path`` and its rotated copies, oldest first (a torn
    last line of a file being written is skipped)."""
    out: list[dict[str, Any]] = []
    for file in log_files(path):
        for line in file.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
    return out
