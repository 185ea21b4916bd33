"""Helpers the decoupled Python models (orchestrator, router) share: one daemon
thread per request, so a long generation does not block the requests queued
behind it, joined at unload; the config's string parameters as a dict; the
deadline of a streamed BLS call (from the request's ``max_tokens``), and
``within_deadline`` / ``batches_within_deadline`` / ``call_within``, which
enforce a BLS call's deadline in the caller whatever the callee does, and
``ExecStream``, which makes a decoupled BLS call and pumps its responses on
one thread (each of them ends early, ``CalleeDown``, once a ``down`` check
says the callee's stub died); ``Workers``, the reused threads all of these run on;
``Responder``, the thread an engine model sends its responses from;
``PruningSender``, which sends only the requested outputs; and
``BlsStreams``, which keeps finished decoupled-BLS response iterators alive
until the stub's own C++ thread has let go of them (the crash workaround
described there). No Triton imports: unit-testable as is."""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

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


class Workers:
    """Daemon threads kept for reuse: ``run(fn)`` hands ``fn`` to an idle
    thread and starts a new one only when every thread is busy; a thread
    idle for ``idle_s`` ends.

    Why not a thread per call: ``Thread.start()`` waits until the new thread
    runs, i.e. two GIL hand-overs on the caller's path. A request on the
    served path used to start three (its request thread, the BLS ``exec()``
    thread, the response pump) before its first token could go out: 1–3 ms
    of its time to first token on two busy cores (benchmarks/ceiling.py). A
    reused thread is woken through a queue instead."""

    def __init__(self, name: str = "trtspec-worker", idle_s: float = 60.0) -> None:
        self.name = name
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job and not yet promised one
        self.threads = 0  # threads alive

    def run(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` on a worker thread (its exceptions are its own to handle)."""
        with self._lock:
            self._jobs.put(fn)
            if self._idle:
                self._idle -= 1
                return
            self.threads += 1
        # The job goes through the queue, never the Thread's arguments: those
        # live as long as the thread, and a job's references (a Triton request,
        # its response sender) must go when the job ends.
        threading.Thread(target=self._loop, name=self.name, daemon=True).start()

    def _loop(self) -> None:
        while True:
            try:
                fn = self._jobs.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    try:  # a job queued for a waiting thread just now
                        fn = self._jobs.get_nowait()
                    except queue.Empty:
                        self._idle -= 1
                        self.threads -= 1
                        return
            with contextlib.suppress(Exception):  # a job handles its own errors
                fn()
            del fn  # drop the job's references before waiting for the next
            with self._lock:
                self._idle += 1


# One pool per process (a stub serves one model; the router's in-process
# variants share the router's).
WORKERS = Workers()


def stream_timeout_us(max_tokens: int | None) -> int:
    """The BLS ``timeout`` (microseconds) of a stream that generates at most
    ``max_tokens`` tokens."""
    tokens = max(1, int(max_tokens or 1))
    return int((BLS_STREAM_BASE_S + BLS_STREAM_PER_TOKEN_S * tokens) * 1_000_000)


class DeadlineExceeded(RuntimeError):
    """A BLS callee did not answer within the caller's deadline."""


class CalleeDown(RuntimeError):
    """A wait on a BLS callee ended early: its ``down`` check (the
    watchdog marked the variant down: a stub it runs on died) said so."""


# How often a wait given a ``down`` check makes it (``trtspec.runtime.health``: a stat).
DOWN_POLL_S = 0.25
# ``down``: None while the callee may still answer, else why it never will.
Down = Callable[[], str | None]


def _get(items: queue.SimpleQueue[Any], deadline: float, down: Down | None) -> Any:
    """The next item by ``deadline`` (``queue.Empty`` after it), asking
    ``down`` every ``DOWN_POLL_S`` meanwhile (``CalleeDown`` when it says)."""
    while True:
        left = max(0.0, deadline - time.monotonic())
        try:
            return items.get(timeout=left if down is None else min(left, DOWN_POLL_S))
        except queue.Empty:
            if down is None or time.monotonic() >= deadline:
                raise
            reason = down()
            if reason:
                raise CalleeDown(reason) from None


def _deadline_error(what: str, timeout_s: float) -> DeadlineExceeded:
    return DeadlineExceeded(
        f"{what}: no answer within its deadline of {timeout_s:g} s; the request was stopped"
    )


def within_deadline(responses: Iterable[T], timeout_s: float, what: str) -> Iterator[T]:
    """``responses`` (a decoupled BLS response iterator) item by item, raising
    ``DeadlineExceeded`` once ``timeout_s`` has passed since this call.

    Why a thread: on tritonserver 2.51 a BLS response iterator blocks in
    ``__next__`` until the callee's final response and has no timeout of its
    own; the request's ``timeout`` is not enforced for a Python-backend callee,
    and an error response after streamed ones never reaches the caller, so a
    plain ``for`` loop waits forever holding the request (and, in the router,
    its route's concurrency slot). A daemon thread pumps the iterator into a
    queue that this generator reads with a timeout. After a deadline the pump
    thread stays blocked until the callee ends (a cancelled callee ends at its
    next step)."""
    for batch in batches_within_deadline(responses, timeout_s, what):
        yield from batch


def batches_within_deadline(
    responses: Iterable[T], timeout_s: float, what: str, down: Down | None = None
) -> Iterator[list[T]]:
    """``within_deadline`` in batches: each batch is every item that had
    arrived by the time the previous one was handled (one item when the
    reader keeps up, several when it falls behind), so a reader that answers
    once per batch sends fewer, fuller responses under load and the same
    ones otherwise."""
    items: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

    def pump() -> None:
        try:
            for item in responses:
                items.put((0, item))
            items.put((1, None))
        except BaseException as exc:  # handed to the reader, which re-raises it
            items.put((2, exc))

    # started here, not at the first next(): the deadline runs from this call
    WORKERS.run(pump)
    deadline = time.monotonic() + timeout_s
    return _batches(items, deadline, timeout_s, what, down)


def _batches(
    items: queue.SimpleQueue[tuple[int, Any]],
    deadline: float,
    timeout_s: float,
    what: str,
    down: Down | None = None,
) -> Iterator[list[Any]]:
    """The reader's side of a pump (see ``batches_within_deadline``); with
    ``down``, a callee marked down ends the wait at once (``CalleeDown``)
    rather than at the deadline."""
    while True:
        try:
            kind, item = _get(items, deadline, down)
        except queue.Empty:
            raise _deadline_error(what, timeout_s) from None
        batch: list[Any] = []
        while kind == 0:
            batch.append(item)
            try:
                kind, item = items.get_nowait()
            except queue.Empty:
                break
        if batch:
            yield batch
        if kind == 1:
            return
        if kind == 2:
            raise item


class ExecStream:
    """A decoupled BLS call made and read on one worker thread: ``call()``
    (``request.exec(decoupled=True)``, which on 2.51 returns once the first
    response is in) and then its responses, pumped into ``batches`` (as
    ``batches_within_deadline``: every item that arrived while the last
    batch was handled) until ``timeout_s`` after this call. ``responses`` is
    the response iterator once ``exec()`` has returned (for
    ``cancel_stream``), else None; ``keep`` (``BlsStreams.keep``) gets it when
    the pump is done with it. One thread and one hand-over fewer than
    ``call_within`` followed by ``batches_within_deadline``."""

    def __init__(
        self,
        call: Callable[[], Iterable[Any]],
        timeout_s: float,
        what: str,
        keep: Callable[[Any], None] | None = None,
        down: Down | None = None,
    ) -> None:
        self.responses: Any = None
        items: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()

        def pump() -> None:
            try:
                self.responses = call()
                for item in self.responses:
                    items.put((0, item))
                items.put((1, None))
            except BaseException as exc:  # handed to the reader, which re-raises it
                items.put((2, exc))
            finally:
                if keep is not None and self.responses is not None:
                    keep(self.responses)

        WORKERS.run(pump)
        self.batches = _batches(items, time.monotonic() + timeout_s, timeout_s, what, down)


def call_within(call: Callable[[], T], timeout_s: float, what: str, down: Down | None = None) -> T:
    """``call()`` (a blocking BLS ``exec()``) or ``DeadlineExceeded`` after
    ``timeout_s``: 2.51 does not enforce a request's ``timeout`` for a
    Python-backend callee either (see ``within_deadline``)."""
    results: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

    def run() -> None:
        try:
            results.put((True, call()))
        except BaseException as exc:
            results.put((False, exc))

    WORKERS.run(run)
    try:
        ok, value = _get(results, time.monotonic() + timeout_s, down)
    except queue.Empty:
        raise _deadline_error(what, timeout_s) from None
    if not ok:
        raise value
    return value


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

    def __init__(self, hold_s: float = 20.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._clock = clock  # a test's own clock: when a hold ends, not how long it took
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
            self._held.append((self._clock() + self.hold_s, iterator))
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
            self._release(self._clock())
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


class PruningSender:
    """A response sender that sends only the outputs its request asked for.

    Why: in tritonserver 2.51's Python backend (python_backend r24.10)
    ``ResponseSender::Send`` releases the GIL and then erases the outputs the
    caller did not request (``PruneOutputTensors``); their NumPy arrays are
    freed there without the GIL, which corrupts pymalloc (the SIGSEGV of
    docs/design/triton-limits.md; python_backend #390, r24.12 on, fixes it). A client
    that requests a subset of the router's or an orchestrator's outputs made
    every response of its stream take that path: the router died within
    seconds at 64 streams in flight (``benchmarks/ceiling.py --flow llmapi``,
    a client asking for ``text_output`` and ``is_final``). Dropping them here,
    in Python with the GIL, leaves the stub nothing to prune.
    ``make(output_tensors=..., error=...)`` builds a response
    (``pb_utils.InferenceResponse``). Off with ``TRTSPEC_BLS_WORKAROUND=0``."""

    def __init__(self, sender: Any, wanted: Iterable[str] | None, make: Callable[..., Any]) -> None:
        self._sender = sender
        # what the request asked for (empty: everything); a caller that
        # builds responses of these outputs alone sends them with send_exact
        self.wanted = frozenset(wanted or ())
        self._make = make

    @classmethod
    def wrap(cls, sender: Any, request: Any, make: Callable[..., Any]) -> Any:
        """``sender`` wrapped for ``request`` (as is with the workaround off)."""
        if not WORKAROUND:
            return sender
        return cls(sender, request.requested_output_names(), make)

    def send_exact(self, response: Any, flags: int = 0) -> None:
        """Send ``response`` as it is: the caller built it of ``wanted``'s
        outputs alone (or of any outputs when ``wanted`` is empty)."""
        self._sender.send(response, flags=flags)

    def send(self, response: Any = None, flags: int = 0) -> None:
        if response is not None and self.wanted:
            tensors = response.output_tensors()
            kept = [t for t in tensors if t.name() in self.wanted]
            if len(kept) < len(tensors):
                error = response.error() if response.has_error() else None
                response = self._make(output_tensors=kept, error=error)
            del tensors, kept
        if response is None:
            self._sender.send(flags=flags)
        else:
            self._sender.send(response, flags=flags)

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


class Responder:
    """Sends responses from one thread of its own, in the order they were
    handed over: an engine model's scheduler thread hands each step's
    responses here and goes on to the next step.

    Why: a Python-backend ``sender.send`` returns only when tritonserver has
    taken the response (~0.3–0.5 ms a response on two busy cores, the GIL
    released meanwhile), so a step loop that sends itself waits that long per
    request per step: at one request in flight a tiny model's served engine
    streamed at 73–84% of its in-process speed. TensorRT-LLM's own backend never
    waits on a send in its generation loop: its executor queues responses
    and the backend's response thread sends them
    (``ModelInstanceState::WaitForResponse`` in
    ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc``,
    NVIDIA/TensorRT-LLM). One thread keeps every request's responses in
    order; at most ``limit`` wait (then ``send`` blocks: backpressure). A
    send's failure (the client went away) is reported through ``log`` and the
    next response goes on. Each item's references (the response, its
    sender) are dropped as soon as it is sent (see ``Workers.run``)."""

    def __init__(self, log: Callable[[str], None] | None = None, limit: int = 4096) -> None:
        self._items: queue.Queue[tuple[Any, Any, int] | None] = queue.Queue(maxsize=limit)
        self._log = log
        self._thread = threading.Thread(target=self._loop, name="trtspec-responder", daemon=True)
        self._thread.start()

    def send(self, sender: Any, response: Any = None, flags: int = 0) -> None:
        """Queue ``sender.send(response, flags=flags)`` (``response`` None:
        ``sender.send(flags=flags)``)."""
        self._items.put((sender, response, flags))

    def _loop(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            sender, response, flags = item
            del item
            try:
                if response is None:
                    sender.send(flags=flags)
                else:
                    sender.send(response, flags=flags)
            except Exception as exc:  # one request's failed send is not the model's
                if self._log is not None:
                    with contextlib.suppress(Exception):
                        self._log(f"sending a response failed: {exc}")
            del sender, response  # drop them before waiting for the next item

    def sender(self, sender: Any) -> _QueuedSender:
        """``sender`` with its ``send`` going through this responder."""
        return _QueuedSender(self, sender)

    def close(self, timeout: float = 5.0) -> bool:
        """Send what is queued, then stop; False if that took over ``timeout`` s."""
        try:
            self._items.put(None, timeout=timeout)
        except queue.Full:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive()


class _QueuedSender:
    """A response sender whose ``send`` is queued on a ``Responder``."""

    def __init__(self, responder: Responder, sender: Any) -> None:
        self._responder = responder
        self._sender = sender

    def send(self, response: Any = None, flags: int = 0) -> None:
        self._responder.send(self._sender, response, flags)

    def is_cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


def string_params(config: dict[str, Any]) -> dict[str, str]:
    """A model config's ``parameters`` as plain strings."""
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


class RequestThreads:
    """Runs ``target(request)`` on a worker thread (``WORKERS``) per request
    and counts the running ones so ``join`` can wait for them at unload."""

    def __init__(self, workers: Workers | None = None) -> None:
        self._workers = workers or WORKERS
        self._running = 0
        self._done = threading.Condition()

    def start(self, target: Callable[[Any], None], request: Any) -> None:
        def run() -> None:
            try:
                target(request)
            finally:
                with self._done:
                    self._running -= 1
                    self._done.notify_all()

        with self._done:
            self._running += 1
        self._workers.run(run)

    def running(self) -> int:
        with self._done:
            return self._running

    def join(self, timeout: float = 10.0) -> None:
        """Wait until no request runs, at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._done:
            while self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._done.wait(left)
