"""A wait on a BLS callee whose stub died ends at once (issue 44): the
watchdog marks the variant down within a poll, and every wait given a
``down`` check (``health.watch``: the router's relay, an orchestrator's
engine calls, in process or in its own stub) sees it within
``threads.DOWN_POLL_S`` and raises ``CalleeDown`` instead of waiting out
the request's deadline (62-70 s for a killed ``target_dte`` before)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trtspec.runtime import health
from trtspec.runtime.threads import (
    DOWN_POLL_S,
    CalleeDown,
    DeadlineExceeded,
    ExecStream,
    call_within,
)


def _mark_later(folder: Path, variant: str, after_s: float) -> threading.Timer:
    timer = threading.Timer(after_s, health.mark_down, args=(folder, variant))
    timer.start()
    return timer


def test_watch_says_why_once_the_variant_is_marked_down(tmp_path: Path) -> None:
    down = health.watch("ngram", tmp_path)
    assert down() is None
    health.mark_down(tmp_path, "ngram")
    assert down() == (
        "variant 'ngram' went down while answering (a stub it runs on died; "
        "the stub watchdog marked it down)"
    )


def test_a_stream_from_a_stub_that_died_ends_at_once_not_at_its_deadline(
    tmp_path: Path,
) -> None:
    never = threading.Event()

    def call() -> list[int]:
        never.wait(30)  # a dead stub's stream: no response ever comes
        return []

    timer = _mark_later(tmp_path, "ngram", 0.3)
    started = time.monotonic()
    stream = ExecStream(call, 60.0, "ngram", down=health.watch("ngram", tmp_path))
    with pytest.raises(CalleeDown, match="variant 'ngram' went down while answering"):
        next(stream.batches)
    waited = time.monotonic() - started
    assert 0.3 <= waited < 0.3 + 4 * DOWN_POLL_S, waited
    never.set()
    timer.join()


def test_a_call_to_a_stub_that_died_ends_at_once(tmp_path: Path) -> None:
    never = threading.Event()
    timer = _mark_later(tmp_path, "draft", 0.3)
    started = time.monotonic()
    with pytest.raises(CalleeDown):
        call_within(lambda: never.wait(30), 60.0, "draft", health.watch("draft", tmp_path))
    assert time.monotonic() - started < 0.3 + 4 * DOWN_POLL_S
    never.set()
    timer.join()


def test_without_a_down_check_the_deadline_still_applies(tmp_path: Path) -> None:
    never = threading.Event()
    health.mark_down(tmp_path, "ngram")  # not asked: only the deadline ends it
    stream = ExecStream(lambda: never.wait(30) and [], 0.5, "ngram")
    with pytest.raises(DeadlineExceeded):
        next(stream.batches)
    # and a check that never fires leaves the deadline as it was
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        call_within(lambda: never.wait(30), 0.6, "x", health.watch("up", tmp_path))
    assert 0.55 <= time.monotonic() - started < 2
    never.set()
