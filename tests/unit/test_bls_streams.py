"""The BLS helpers of runtime/threads.py: the stream deadline formula,
its enforcement in the caller (``within_deadline``, ``call_within``,
``ExecStream``), the reused worker threads they run on (``Workers``), and
``BlsStreams`` keeping finished response iterators alive past the 2.51 stub's
GIL-less cleanup, then dropping them on its own Python thread, and the
``Responder`` an engine model's step loop hands its responses to, and the
``PruningSender`` that sends only the requested outputs."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import Any, ClassVar

import pytest

from trtspec.runtime import threads
from trtspec.runtime.threads import (
    BlsStreams,
    DeadlineExceeded,
    PruningSender,
    Responder,
    call_within,
    stream_timeout_us,
    within_deadline,
)


def test_stream_deadline_follows_max_tokens() -> None:
    # 30 s + 2 s per token, in microseconds; never the old flat 30 minutes
    assert stream_timeout_us(128) == 286_000_000
    assert stream_timeout_us(16) == 62_000_000
    assert stream_timeout_us(None) == stream_timeout_us(0) == 32_000_000
    assert stream_timeout_us(128) < 1800 * 1_000_000


class Iterator:
    """Stands for a pybind ResponseIterator: records which thread frees it."""

    freed_on: ClassVar[list[str]] = []

    def __del__(self) -> None:
        Iterator.freed_on.append(threading.current_thread().name)


class Clock:
    """A monotonic clock the test moves, which counts the release thread's
    looks at it: a hold ends when the test says, and the test waits for the
    looks themselves, not for however long a loaded machine takes."""

    def __init__(self) -> None:
        self._now = 1000.0
        self._looks = 0
        self._cond = threading.Condition()

    def __call__(self) -> float:
        with self._cond:
            if threading.current_thread().name == "trtspec-bls-release":
                self._looks += 1
                self._cond.notify_all()
            return self._now

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._now += seconds

    def wait_looks(self, n: int) -> None:
        """Until the release thread has read the clock ``n`` more times: with
        n = 2, the first of those looks has run to its end."""
        with self._cond:
            target = self._looks + n
            assert self._cond.wait_for(lambda: self._looks >= target, timeout=30), self._looks


def test_kept_iterators_outlive_their_caller_then_go_on_the_release_thread() -> None:
    clock = Clock()
    streams = BlsStreams(hold_s=20.0, clock=clock)
    it = Iterator()
    ref = weakref.ref(it)

    t = threading.Thread(target=streams.keep, args=(it,), name="request-thread")
    t.start()
    t.join()
    del it
    gc.collect()
    assert ref() is not None and streams.held() == 1  # the caller let go; we did not
    clock.advance(19.9)  # not yet: the release thread looks and keeps it
    clock.wait_looks(2)
    assert ref() is not None and streams.held() == 1
    clock.advance(0.2)  # the hold is over: dropped at the release thread's next look
    clock.wait_looks(2)
    assert ref() is None and streams.held() == 0
    assert Iterator.freed_on[-1] == "trtspec-bls-release"
    streams.close()


def test_close_drops_everything_at_once() -> None:
    streams = BlsStreams(hold_s=3600)
    it = Iterator()
    ref = weakref.ref(it)
    streams.keep(it)
    del it
    streams.close()
    assert ref() is None and streams.held() == 0


class Stuck:
    """Stands for a 2.51 BLS response iterator whose callee failed after
    streaming: two responses, then ``__next__`` blocks until ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.sent = 0

    def __iter__(self) -> Stuck:
        return self

    def __next__(self) -> int:
        if self.sent < 2:
            self.sent += 1
            return self.sent
        self.release.wait()
        raise StopIteration


def test_within_deadline_yields_then_stops_a_stuck_stream_at_its_deadline() -> None:
    stuck = Stuck()
    got: list[int] = []
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^ngram: no answer within its deadline of 0.3 s"):
        for item in within_deadline(stuck, 0.3, "ngram"):
            got.append(item)
    waited = time.monotonic() - start
    stuck.release.set()  # lets the pump thread end
    assert got == [1, 2]
    assert 0.3 <= waited < 2.0, waited


def test_within_deadline_ends_with_the_stream_and_passes_its_error_on() -> None:
    assert list(within_deadline(iter([1, 2, 3]), 5.0, "x")) == [1, 2, 3]

    def failing() -> Any:
        yield 1
        raise ValueError("callee broke")

    with pytest.raises(ValueError, match="callee broke"):
        list(within_deadline(failing(), 5.0, "x"))


def test_call_within_returns_raises_or_gives_up_at_the_deadline() -> None:
    assert call_within(lambda: 7, 5.0, "target") == 7
    with pytest.raises(KeyError):
        call_within(lambda: {}["k"], 5.0, "target")
    gate = threading.Event()
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match=r"^target_dte: no answer within"):
        call_within(lambda: gate.wait(30), 0.2, "target_dte")
    assert time.monotonic() - start < 2.0
    gate.set()


def test_items_that_arrived_meanwhile_come_as_one_batch() -> None:
    """``batches_within_deadline``: what queued up while the reader was busy
    is one batch; a reader that keeps up gets one item at a time."""
    from trtspec.runtime.threads import batches_within_deadline

    gate = threading.Event()

    def source():
        yield from (1, 2, 3)
        gate.wait(5)
        yield 4

    batches = batches_within_deadline(source(), 10.0, "engine")
    time.sleep(0.3)  # 1, 2 and 3 arrive before the first read
    assert next(batches) == [1, 2, 3]
    gate.set()
    assert list(batches) == [[4]]


def test_workers_reuse_an_idle_thread_and_start_one_only_when_all_are_busy() -> None:
    from trtspec.runtime.threads import Workers

    pool = Workers(name="test-pool", idle_s=0.5)
    seen: list[int] = []
    done = threading.Event()
    pool.run(lambda: (seen.append(threading.get_ident()), done.set()))
    assert done.wait(5)
    deadline = time.monotonic() + 5
    while pool._idle != 1 and time.monotonic() < deadline:  # back in the pool
        time.sleep(0.01)
    done.clear()
    pool.run(lambda: (seen.append(threading.get_ident()), done.set()))
    assert done.wait(5)
    assert seen[0] == seen[1] and pool.threads == 1  # the same thread ran both

    # two jobs at once: a second thread
    gate, started = threading.Event(), threading.Barrier(3, timeout=5)
    for _ in range(2):
        pool.run(lambda: (started.wait(), gate.wait(5)))
    started.wait()  # both run at the same time
    assert pool.threads == 2
    gate.set()
    # and an idle thread ends after idle_s
    deadline = time.monotonic() + 5
    while pool.threads and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.threads == 0


def test_a_failing_job_does_not_take_its_worker_down() -> None:
    from trtspec.runtime.threads import Workers

    pool = Workers(name="test-pool", idle_s=5)
    pool.run(lambda: {}["missing"])
    done = threading.Event()
    pool.run(done.set)
    assert done.wait(5) and pool.threads == 1


def test_exec_stream_calls_and_pumps_on_one_thread_and_keeps_the_iterator() -> None:
    from trtspec.runtime.threads import ExecStream

    threads: set[int] = set()
    kept: list[Any] = []

    class Responses:
        def __iter__(self):
            threads.add(threading.get_ident())
            yield from (1, 2, 3)

    responses = Responses()

    def call() -> Responses:
        threads.add(threading.get_ident())
        return responses

    stream = ExecStream(call, 5.0, "target", keep=kept.append)
    assert [x for batch in stream.batches for x in batch] == [1, 2, 3]
    assert len(threads) == 1 and threading.get_ident() not in threads
    assert stream.responses is responses
    deadline = time.monotonic() + 5
    while not kept and time.monotonic() < deadline:
        time.sleep(0.01)
    assert kept == [responses]  # handed to BlsStreams once the pump let go


def test_exec_stream_passes_errors_on_and_gives_up_on_a_stuck_exec() -> None:
    from trtspec.runtime.threads import ExecStream

    def broken() -> Any:
        raise RuntimeError("target: model unavailable")

    with pytest.raises(RuntimeError, match="model unavailable"):
        list(ExecStream(broken, 5.0, "target").batches)

    gate = threading.Event()
    start = time.monotonic()
    stuck = ExecStream(lambda: gate.wait(30) and [], 0.2, "target_dte")
    with pytest.raises(DeadlineExceeded, match=r"^target_dte: no answer within its deadline"):
        list(stuck.batches)
    assert time.monotonic() - start < 2.0 and stuck.responses is None
    gate.set()


def test_a_finished_jobs_references_go_while_its_worker_lives_on() -> None:
    """A served request (and its response sender) must not outlive its job:
    a pool that kept a thread's first job (in the Thread's arguments, say)
    until the thread ended crashed tritonserver 2.51 within minutes
    (``boost::interprocess::lock_exception`` in the Python backend)."""
    from trtspec.runtime.threads import Workers

    class Request:
        pass

    pool = Workers(name="test-pool", idle_s=30)
    done = threading.Event()
    for _ in range(2):  # the first job of a new thread, then one of a reused thread
        request = Request()
        ref = weakref.ref(request)
        done.clear()
        pool.run(lambda r=request: (r, done.set()))
        del request
        assert done.wait(5)
        deadline = time.monotonic() + 5
        while ref() is not None and time.monotonic() < deadline:
            time.sleep(0.01)
            gc.collect()
        assert ref() is None, "the worker still holds a finished job's request"
    assert pool.threads == 1


class SlowSender:
    """Stands for a response sender whose ``send`` returns only when the
    server has taken the response (here: after ``delay_s``)."""

    def __init__(self, delay_s: float = 0.0, fail_on: object = None) -> None:
        self.delay_s = delay_s
        self.fail_on = fail_on
        self.sent: list[tuple[object, int]] = []

    def send(self, response: object = None, flags: int = 0) -> None:
        time.sleep(self.delay_s)
        if response is not None and response is self.fail_on:
            raise RuntimeError("client went away")
        self.sent.append((response, flags))


def test_the_responder_sends_in_order_without_making_the_caller_wait() -> None:
    responder = Responder()
    a, b = SlowSender(delay_s=0.05), SlowSender(delay_s=0.05)
    started = time.monotonic()
    for i in range(4):  # interleaved, as a step answers every request in flight
        responder.send(a, f"a{i}", 1 if i == 3 else 0)
        responder.send(b, f"b{i}", 0)
    responder.send(b, None, 1)  # a final flag without a response
    handed_over = time.monotonic() - started
    assert responder.close()
    assert handed_over < 0.2  # nine sends of 50 ms each did not run on this thread
    assert a.sent == [("a0", 0), ("a1", 0), ("a2", 0), ("a3", 1)]
    assert b.sent == [("b0", 0), ("b1", 0), ("b2", 0), ("b3", 0), (None, 1)]


def test_a_failed_send_is_logged_and_the_next_goes_out() -> None:
    logged: list[str] = []
    gone = object()
    responder = Responder(log=logged.append)
    dead, alive = SlowSender(fail_on=gone), SlowSender()
    responder.send(dead, gone, 1)
    responder.send(alive, "x", 1)
    assert responder.close()
    assert alive.sent == [("x", 1)] and dead.sent == []
    assert logged == ["sending a response failed: client went away"]


def test_the_responder_drops_a_sent_responses_references_while_it_waits() -> None:
    # a request's sender and responses must not outlive it in an idle thread
    # (the pool that kept them made tritonserver 2.51 abort; see Workers.run)
    class Response:
        pass

    responder = Responder()
    sender, response = SlowSender(), Response()
    gone_sender, gone_response = weakref.ref(sender), weakref.ref(response)
    responder.send(sender, response, 1)
    del sender, response
    deadline = time.monotonic() + 5
    while (
        gone_sender() is not None or gone_response() is not None
    ) and time.monotonic() < deadline:
        time.sleep(0.01)
        gc.collect()
    assert gone_sender() is None and gone_response() is None
    responder.close()


def test_a_full_responder_makes_the_step_wait() -> None:
    responder = Responder(limit=1)
    slow = SlowSender(delay_s=0.1)
    started = time.monotonic()
    for i in range(4):
        responder.send(slow, i, 0)
    waited = time.monotonic() - started
    assert responder.close()
    assert waited >= 0.15  # backpressure: at most one response waits
    assert [r for r, _ in slow.sent] == [0, 1, 2, 3]


class FakeTensor:
    def __init__(self, name: str) -> None:
        self._name = name

    def name(self) -> str:
        return self._name


class FakeResponse:
    def __init__(self, output_tensors: list[FakeTensor], error: object = None) -> None:
        self.tensors = output_tensors
        self._error = error

    def output_tensors(self) -> list[FakeTensor]:
        return list(self.tensors)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> object:
        return self._error


class FakeRequest:
    def __init__(self, wanted: list[str]) -> None:
        self.wanted = wanted

    def requested_output_names(self) -> list[str]:
        return self.wanted


def test_the_pruning_sender_sends_only_the_requested_outputs() -> None:
    # on 2.51 the stub would prune the rest without the GIL (docs/design/triton-limits.md)
    raw = SlowSender()
    sender = PruningSender.wrap(raw, FakeRequest(["text_output", "is_final"]), FakeResponse)
    full = FakeResponse([FakeTensor(n) for n in ("text_output", "output_ids", "is_final")])
    sender.send(full, flags=0)
    exact = FakeResponse([FakeTensor("text_output")])
    sender.send(exact, flags=0)  # nothing to drop: sent as it is
    failed = FakeResponse([FakeTensor("output_ids")], error="boom")
    sender.send(failed, flags=1)
    sender.send(None, flags=1)
    (first, f1), (second, _), (third, f3), (fourth, f4) = raw.sent
    assert isinstance(first, FakeResponse) and first is not full and f1 == 0
    assert [t.name() for t in first.tensors] == ["text_output", "is_final"]
    assert second is exact
    assert isinstance(third, FakeResponse) and third.tensors == [] and third.error() == "boom"
    assert f3 == 1 and (fourth, f4) == (None, 1)


def test_send_exact_sends_as_built_without_reading_the_outputs() -> None:
    """A caller that built a response of the requested outputs alone (the
    orchestrator's streamed responses) skips the look at every tensor."""

    class Unread(FakeResponse):
        def output_tensors(self) -> list[FakeTensor]:
            raise AssertionError("send_exact read the outputs")

    raw = SlowSender()
    sender = PruningSender.wrap(raw, FakeRequest(["text_output", "is_final"]), FakeResponse)
    assert sender.wanted == frozenset({"text_output", "is_final"})
    built = Unread([FakeTensor("text_output"), FakeTensor("is_final")])
    sender.send_exact(built, flags=0)
    assert raw.sent == [(built, 0)]


def test_the_pruning_sender_passes_everything_when_nothing_was_named(monkeypatch: Any) -> None:
    raw = SlowSender()
    sender = PruningSender.wrap(raw, FakeRequest([]), FakeResponse)
    full = FakeResponse([FakeTensor("a"), FakeTensor("b")])
    sender.send(full)
    assert raw.sent == [(full, 0)]
    monkeypatch.setattr(threads, "WORKAROUND", False)
    assert PruningSender.wrap(raw, FakeRequest(["a"]), FakeResponse) is raw


def test_a_queued_sender_sends_through_its_responder_in_order() -> None:
    responder = Responder()
    raw = SlowSender(delay_s=0.02)
    sender = responder.sender(raw)
    started = time.monotonic()
    sender.send("a")
    sender.send("b", flags=0)
    sender.send(flags=1)
    assert time.monotonic() - started < 0.05  # the caller did not wait on the sends
    assert responder.close()
    assert raw.sent == [("a", 0), ("b", 0), (None, 1)]
