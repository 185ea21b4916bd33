"""The router's per-request log: one JSON line per request with exactly
``FIELDS``, written by a background thread from a bounded queue so a slow
disk never holds a request (a full queue drops the line and counts it in
``dropped``). To a size-bounded rotating file (``requests.jsonl``, rotated to
``.1`` … ``.backups``) or to stdout (a container's log collector). The
prompt's text is never logged unless the rollout's ``log.prompts`` asks
(then as ``prompt``, after the fixed fields). Stdlib-only (POSIX).

Several router processes (Triton's ``instance_group { count: N }``) may each
hold a ``LineWriter`` on the same file. Each one gathers the lines it has at
hand into a batch of whole lines and appends it with a single ``os.write``
on an ``O_APPEND`` descriptor, while holding an ``flock`` on ``<name>.lock``
next to the log. Under that lock it first reopens the path if another
process rotated it away, then rotates itself when the batch would not fit.
So no line is ever torn or mixed with another process's line, only one
process rotates at a time, no process appends to a file already rotated
away, every file stays within ``max_bytes`` (unless one line alone is
longer), and with enough ``backups`` no line is lost. The lock dies with
its process, so a crashed router never blocks the others. A full disk
(or a file size limit) leaves no half line either: a write refused part
way is cut back to its last whole line, a torn tail left by a writer killed
mid-write is cut before the next append, and the lines lost are counted in
``dropped`` and said on stderr when the failures start and when they end.
``read_lines``
holds the same lock shared while it lists and reads the files, so a
rotation never makes it skip or repeat a file.

To stdout, every process's batch goes with ``os.write`` to the shared
descriptor (not through its own ``sys.stdout`` buffer), under an ``flock``
on the ``lock`` file the caller names (the router: ``requests.jsonl.lock``
in the rollout folder): a pipe write over ``PIPE_BUF`` bytes is not atomic,
and unlocked the lines of several processes tore each other. Where that
lock cannot be had, a batch goes in writes of at most ``PIPE_BUF`` bytes
that end on a line's end (each atomic on a pipe; a line longer than that
alone can still tear); so does a batch whose lock another process has held
for over ``STREAM_LOCK_WAIT_S`` (a frozen router keeps it while it waits for
its GIL, and must not stop every other router's log).

After ``close`` a ``write`` is refused and counted in ``dropped``: nothing
would write it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import select
import sys
import threading
import time
from collections.abc import Iterator
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

# The most bytes one batch gathers (one write, one lock hold).
BATCH_BYTES = 64 * 1024
# The most bytes one write to a pipe puts in it whole (POSIX: at least 512).
PIPE_BUF = getattr(select, "PIPE_BUF", 512)
# How long a batch for a stream waits for the other processes' lock before it
# goes out in PIPE_BUF pieces instead (a frozen holder must not stop every log).
STREAM_LOCK_WAIT_S = 1.0
_STOP = object()


def lock_path(path: Path) -> Path:
    """The lock file of the log ``path``: ``<name>.lock`` beside it."""
    return path.with_name(path.name + ".lock")


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
        lock: Path | None = None,
    ) -> None:
        """``lock``: without a ``path``, the file whose ``flock`` every
        process writing lines to the same stream holds around its write."""
        self.path = Path(path) if path is not None else None
        self.max_bytes = max_bytes
        self.backups = backups
        self.stream = stream
        self.dropped = 0
        self.written = 0
        # guards ``dropped`` (request threads and the writer's thread count
        # into it) and ``_closed`` (no line is queued behind the stop)
        self._state = threading.Lock()
        self._closed = False
        self._lock_path = lock_path(self.path) if self.path is not None else lock
        self._lock_failed = False
        # a run of failed writes: said when it starts and when it ends
        self._failing = False
        self._dropped_before = 0
        self._lock_waited = False  # said once that the stream's lock was held too long
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        # A batch that fits max_bytes keeps every file within it.
        self._batch = BATCH_BYTES if path is None else min(BATCH_BYTES, max_bytes)
        self._fd: int | None = None
        self._lock_fd: int | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="trtspec-log", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> bool:
        """Queue one line; False (and counted in ``dropped``) when the queue
        is full or the writer is closed."""
        with self._state:
            if not self._closed:
                try:
                    self._queue.put_nowait(record)
                    return True
                except queue.Full:
                    pass
            self.dropped += 1
            return False

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until what was queued so far is written (tests, shutdown)."""
        if not self._thread.is_alive():
            return
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return
        done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what was queued (waiting at most about ``timeout`` s for
        room and as long for the writer) and refuse any later line."""
        with self._state:
            closed, self._closed = self._closed, True
        if not closed:
            with contextlib.suppress(queue.Full):
                self._queue.put(_STOP, timeout=timeout)
        self._thread.join(timeout)

    def _drop(self, n: int) -> None:
        with self._state:
            self.dropped += n

    def _run(self) -> None:
        held: str | None = None  # the line that did not fit the last batch
        stop = False
        while not stop:
            lines = [held] if held is not None else []
            size = len(held) if held is not None else 0
            held = None
            done: list[threading.Event] = []
            item = self._take() if lines else self._queue.get()
            while item is not None:
                if item is _STOP:
                    stop = True
                    break
                if isinstance(item, threading.Event):
                    done.append(item)
                elif (line := self._line(item)) is not None:
                    if lines and size + len(line) > self._batch:
                        held = line
                        break
                    lines.append(line)
                    size += len(line)
                item = self._take()
            if lines:
                self._write(lines)
            for event in done:
                event.set()
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)

    def _take(self) -> Any:
        """The next queued item, or None when the queue is empty right now."""
        try:
            return self._queue.get_nowait()
        except queue.Empty:
            return None

    def _line(self, record: Any) -> str | None:
        """One JSON line (ASCII, so its length is its size in bytes); None,
        counted in ``dropped``, when the record cannot be written as JSON."""
        try:
            return json.dumps(record, separators=(",", ":"), default=str) + "\n"
        except (ValueError, TypeError) as exc:
            self._drop(1)
            print(f"trtspec request log: {exc}", file=sys.stderr)
            return None

    def _write(self, lines: list[str]) -> None:
        error: Exception | None
        try:
            self._emit("".join(lines))
            kept, error = len(lines), None
        except _Torn as torn:  # the lines that fit stay, whole
            kept, error = torn.kept, torn.error
        except Exception as exc:  # (no stream at all, say) the writer thread lives on
            kept, error = 0, exc
        self.written += kept
        if error is None:
            if self._failing:
                self._failing = False
                self._say(
                    f"writing again after {self.dropped - self._dropped_before} dropped lines"
                )
            return
        self._drop(len(lines) - kept)
        if not self._failing:  # said once per run of failures, not per batch
            self._failing, self._dropped_before = True, self.dropped - (len(lines) - kept)
            reason = getattr(error, "strerror", None) or repr(error)
            self._say(
                f"{len(lines) - kept} lines dropped ({reason}); lines are dropped and "
                "counted (trtspec_log_dropped_lines_total) until a write succeeds"
            )

    def _say(self, message: str) -> None:
        where = self.path if self.path is not None else "stream"
        print(f"trtspec request log: {where}: {message}", file=sys.stderr)

    def _emit(self, text: str) -> None:
        """Append whole lines: one write, under the lock shared by every
        process writing this path. A write the disk refuses part of (full,
        or over the file size limit) is cut back to its last whole line,
        and a torn tail an earlier writer left (killed mid-write) is cut
        before the next append, so the file only ever holds whole lines."""
        if self.path is None:
            self._emit_stream(text)
            return
        data = text.encode("utf-8")
        if self._lock_fd is None:
            self._lock_fd = os.open(lock_path(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            fd = self._current()
            size = _whole_lines(fd, self._say)
            if size and size + len(data) > self.max_bytes:
                fd = self._rotate()
                size = 0
            _append_lines(fd, data, size)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _emit_stream(self, text: str) -> None:
        """Whole lines to the stream's descriptor: one write under the
        ``lock`` file's ``flock``, else writes of whole lines of at most
        ``PIPE_BUF`` bytes (see the module's docstring)."""
        stream = self.stream or sys.stdout
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):  # in memory: this process's alone
            stream.write(text)
            stream.flush()
            return
        stream.flush()  # what this process wrote through the stream goes first
        data = text.encode("utf-8")
        lock_fd = self._stream_lock()
        if lock_fd is None or not _lock_within(lock_fd, STREAM_LOCK_WAIT_S):
            # no lock, or its holder is stuck (a frozen router process keeps
            # it while it waits for its GIL): whole lines in atomic writes
            if lock_fd is not None and not self._lock_waited:
                self._lock_waited = True
                print(
                    f"trtspec request log: {self._lock_path} held over "
                    f"{STREAM_LOCK_WAIT_S:g} s by another process; lines go out in writes "
                    f"of at most {PIPE_BUF} bytes while it is",
                    file=sys.stderr,
                )
            for chunk in line_chunks(data, PIPE_BUF):
                _write_all(fd, chunk)
            return
        try:
            _write_all(fd, data)
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)

    def _stream_lock(self) -> int | None:
        """The ``lock`` file's descriptor; None without one, or when it
        cannot be opened (said once on stderr)."""
        if self._lock_fd is not None or self._lock_path is None or self._lock_failed:
            return self._lock_fd
        try:
            self._lock_path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            self._lock_failed = True
            print(
                f"trtspec request log: no lock file ({exc}); lines go out in writes "
                f"of at most {PIPE_BUF} bytes",
                file=sys.stderr,
            )
        return self._lock_fd

    def _current(self) -> int:
        """The open file, reopened when the path no longer names it (another
        process rotated it away, or it was removed)."""
        assert self.path is not None
        if self._fd is not None:
            mine = os.fstat(self._fd)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_ino, now.st_dev) == (mine.st_ino, mine.st_dev):
                return self._fd
            os.close(self._fd)
            self._fd = None
        # read too: _whole_lines looks at the last byte
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def _rotate(self) -> int:
        """Shift ``path`` → ``.1`` → … ``.backups`` (the oldest falls off); the
        caller holds the lock, so no other process rotates at the same time."""
        assert self.path is not None and self._fd is not None
        os.close(self._fd)
        self._fd = None
        if self.backups > 0:
            for i in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{i}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{i + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        else:
            self.path.unlink(missing_ok=True)
        return self._current()


def _lock_within(fd: int, wait_s: float) -> bool:
    """``flock(fd, LOCK_EX)``, giving up after ``wait_s`` (False)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)
        except OSError:
            return False


class _Torn(OSError):
    """A write of whole lines failed part way; ``kept`` of them are in the file."""

    def __init__(self, kept: int, error: OSError) -> None:
        super().__init__(error.errno, error.strerror)
        self.kept = kept
        self.error = error


def _append_lines(fd: int, data: bytes, start: int) -> None:
    """Append ``data`` (whole lines) to the file ``fd`` whose size is
    ``start``; on a failure part way (ENOSPC, EFBIG) the file is cut back
    to the end of the last whole line written and ``_Torn`` raised."""
    done, view = 0, memoryview(data)
    try:
        while done < len(data):
            done += os.write(fd, view[done:])
    except OSError as exc:
        keep = data.rfind(b"\n", 0, done) + 1
        with contextlib.suppress(OSError):  # truncating frees space: it works on a full disk
            os.ftruncate(fd, start + keep)
        raise _Torn(data.count(b"\n", 0, keep), exc) from exc


def _whole_lines(fd: int, say: Any) -> int:
    """The size of the file ``fd`` once a torn last line (one not ended by
    a newline: a writer killed mid-write) is cut off; ``say`` is told."""
    size = os.fstat(fd).st_size
    if not size or os.pread(fd, 1, size - 1) == b"\n":
        return size
    end = size
    while end > 0:
        start = max(0, end - 65536)
        cut = os.pread(fd, end - start, start).rfind(b"\n")
        if cut >= 0:
            end = start + cut + 1
            break
        end = start
    os.ftruncate(fd, end)
    say(f"cut a torn last line of {size - end} bytes (a write that did not finish)")
    return end


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def line_chunks(data: bytes, limit: int) -> Iterator[bytes]:
    """``data`` (whole lines) in pieces of whole lines of at most ``limit``
    bytes; a line longer than that is a piece of its own."""
    start, end = 0, len(data)
    while end - start > limit:
        cut = data.rfind(b"\n", start, start + limit)
        if cut < 0:  # one line longer than limit: whole
            cut = data.find(b"\n", start + limit)
            if cut < 0:
                break
        yield data[start : cut + 1]
        start = cut + 1
    if start < end:
        yield data[start:]


def log_files(path: Path) -> list[Path]:
    """``path`` and its rotated copies, oldest first (not ``<name>.lock``)."""
    path = Path(path)
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    return [*rotated, *([path] if path.exists() else [])]


@contextlib.contextmanager
def _shared_lock(path: Path) -> Iterator[bool]:
    """Hold the writers' lock of ``path`` shared (they rotate holding it
    exclusive); True when held. Never creates it: a lock file made by a
    reader of another user could keep the writers from opening it."""
    try:
        fd = os.open(lock_path(path), os.O_RDONLY)
    except OSError:  # no writer yet, or not readable
        yield False
        return
    try:
        held = True
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:  # e.g. no locks on this file system
            held = False
        yield held
    finally:
        os.close(fd)  # and the lock with it


def read_lines(path: Path) -> list[dict[str, Any]]:
    """Every record of ``path`` and its rotated copies, oldest first (a torn
    last line of a file being written is skipped). The files are listed and
    read under the writers' lock, shared, so no rotation comes in between;
    without it (no lock file, or it cannot be read) a file that went away
    meanwhile is skipped."""
    path = Path(path)
    texts: list[bytes] = []
    with _shared_lock(path):
        for file in log_files(path):
            try:
                texts.append(file.read_bytes())
            except FileNotFoundError:
                continue
    out: list[dict[str, Any]] = []
    for text in texts:
        for line in text.decode("utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
    return out
