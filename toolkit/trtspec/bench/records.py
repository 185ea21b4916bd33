"""The on-disk data of a benchmark run: the writer of ``requests.jsonl``
rows (``trtspec.artifacts.bench_run.RequestRow``; appended and flushed as
each request completes, so a Ctrl-C or a kill keeps every finished request),
the tolerant reader that ignores a torn last line, and the atomic writer
every other artefact of a run goes through (temp file in the same folder +
``os.replace``)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from trtspec import fsutil
from trtspec.artifacts.bench_run import Cell, RequestRow
from trtspec.catalogue import BASELINE
from trtspec.errors import BenchError


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


#: A speculative variant's note when its final response carries no draft or
#: accepted counts (the LLM-API flow where the llmapi model zeroes them).
ACCEPTANCE_NOT_REPORTED = (
    "not available: the served model reports no draft/accepted counts at this "
    "TensorRT-LLM version (never read as 0)"
)


def ids_hash(ids: Iterable[int]) -> str:
    return hashlib.sha256(",".join(str(int(i)) for i in ids).encode()).hexdigest()[:16]


def atomic_write_text(path: Path, text: str) -> None:
    """Results files are flushed to disk before the rename: a crash right
    after a run must not leave an empty summary behind."""
    fsutil.atomic_write_text(path, text, fsync=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    fsutil.atomic_write_bytes(path, data)


def atomic_write_json(path: Path, data: Any) -> None:
    fsutil.atomic_write_json(path, data, fsync=True)


class RequestLog:
    """Append-only ``requests.jsonl``: one line per completed request, written
    under a lock so concurrent workers never interleave lines. Each line goes
    to the OS in one ``write`` (it survives Ctrl-C and kill -9 of this
    process); a write that fails (a full disk) is cut back off the file, so
    the file keeps only whole rows, and raises an ``OSError`` naming it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            raise OSError(exc.errno, exc.strerror, exc.filename or str(path)) from exc
        self._lock = threading.Lock()
        self.count = 0

    def append(self, row: Mapping[str, Any]) -> None:
        data = (json.dumps(row, sort_keys=False, default=str, ensure_ascii=False) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path}: append after close")
            good = os.fstat(self._fd).st_size
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._fd, view) :]
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, good)  # freeing space never needs space
                raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
            self.count += 1

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    os.fsync(fd)
                except OSError as exc:
                    if exc.errno != errno.EINVAL:  # EINVAL: a device that cannot sync
                        raise OSError(exc.errno, exc.strerror, str(self.path)) from exc
                finally:
                    os.close(fd)

    def __enter__(self) -> RequestLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_requests(path: Path) -> list[RequestRow]:
    """Rows of ``requests.jsonl``. A torn *last* line (the process died while
    writing it) is skipped; a malformed line elsewhere is an error naming it."""
    if not path.is_file():
        raise BenchError(
            f"{path}: no such file",
            hint="point `trtspec report` at a run folder written by `trtspec bench`",
        )
    rows: list[RequestRow] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if n == len(lines):
                break
            raise BenchError(
                f"{path}:{n}: not a JSON object ({exc.msg})",
                hint="requests.jsonl holds one JSON object per line; remove or fix that line",
            ) from None
        if not isinstance(row, dict) or "route" not in row or "variant" not in row:
            raise BenchError(
                f"{path}:{n}: not a request row (needs 'route' and 'variant')",
                hint="requests.jsonl holds one JSON object per line; remove or fix that line",
            )
        rows.append(cast(RequestRow, row))
    return rows


def pairs_with(row: RequestRow | Cell) -> str | None:
    """The arm a row or cell is compared with: ``baseline`` for Triton variants,
    its named twin for an external speculative arm, None for a baseline arm
    (rows written before external arms existed carry no such field)."""
    if "pairs_with" in row:
        return row["pairs_with"]
    return None if row["variant"] == BASELINE else BASELINE
