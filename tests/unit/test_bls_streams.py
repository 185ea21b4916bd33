"""The BLS helpers of repo/models/threads.py: the stream deadline formula, and
``BlsStreams`` keeping finished response iterators alive past the 2.51 stub's
GIL-less cleanup, then dropping them on its own Python thread."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from typing import ClassVar

from trtspec.repo.models.threads import BlsStreams, stream_timeout_us


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


def test_kept_iterators_outlive_their_caller_then_go_on_the_release_thread() -> None:
    streams = BlsStreams(hold_s=0.6)
    it = Iterator()
    ref = weakref.ref(it)

    t = threading.Thread(target=streams.keep, args=(it,), name="request-thread")
    t.start()
    t.join()
    del it
    gc.collect()
    assert ref() is not None and streams.held() == 1  # the caller let go; we did not
    deadline = time.monotonic() + 10
    while ref() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
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
