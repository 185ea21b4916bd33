"""The router's fallback retry gives back the route's in-flight place first:
a request whose variant failed and that now runs on the fallback no longer
counts against the variant's ``max_concurrency`` (a failing variant would
otherwise starve its own route), and its place is released exactly once.

Runs the router's real ``_serve`` with the stand-in ``triton_python_backend_utils``
of test_inprocess_variants and a ``_forward`` that plays each try."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.unit.test_inprocess_variants import Sender, Tensor, _fake_pb_utils

from trtspec.artifacts.routing import InFlight, parse_routing

TABLE = parse_routing({"routes": {"code": {"variant": "ngram", "max_concurrency": 1}}})


class Request:
    def __init__(self, request_id: str) -> None:
        self._inputs = [
            Tensor("text_input", np.array([b"abc"], dtype=np.object_)),
            Tensor("route", np.array([b"code"], dtype=np.object_)),
            Tensor("request_id", np.array([request_id.encode()], dtype=np.object_)),
        ]
        self.sender = Sender()

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def get_response_sender(self) -> Sender:
        return self.sender

    def request_id(self) -> str:
        return ""

    def requested_output_names(self) -> list[str]:
        return []


class Live:
    def table(self) -> Any:
        return TABLE

    def begin(self, *_: Any, **__: Any) -> None:
        pass

    def end(self, *_: Any) -> None:
        pass


class Counting(InFlight):
    def __init__(self) -> None:
        super().__init__()
        self.released = 0

    def release(self, table: Any, route: Any, choice: Any) -> None:
        self.released += choice.canary
        super().release(table, route, choice)


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    names = [n for n in list(sys.modules) if n.startswith("trtspec.runtime.models.")]
    saved = {n: sys.modules.pop(n) for n in names}
    try:
        module = importlib.import_module("trtspec.runtime.models.router")
        model = module.TritonPythonModel.__new__(module.TritonPythonModel)
        model.live, model._in_flight, model._inprocess = Live(), Counting(), None
        yield model
    finally:
        for n in [n for n in list(sys.modules) if n.startswith("trtspec.runtime.models.")]:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def test_a_retry_on_the_fallback_holds_no_place_of_the_variants(router: Any) -> None:
    tries: list[tuple[str, int]] = []  # (variant, the route's count during the try)

    def forward(variant: str, inputs: Any, sender: Any, progress: Any, cancel: Any, **_: Any):
        tries.append((variant, router._in_flight.count("code")))
        if len(tries) == 1:
            raise RuntimeError("ngram: the stub died")
        if len(tries) == 2:  # while it retries on the fallback, another request comes
            router._serve(Request("other"))

    router._forward = forward
    request = Request("r1")  # canary_percent 100 by default: on ngram
    router._serve(request)
    # the failed try held the place; the retry on baseline did not, so the
    # other request got ngram (and gave its place back)
    assert tries == [("ngram", 1), ("baseline", 0), ("ngram", 1)], tries
    assert router._in_flight.count("code") == 0
    assert router._in_flight.released == 2  # each admitted place released once


def test_a_request_waiting_on_a_variant_that_went_down_moves_to_the_fallback(
    router: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44, over BLS: the router waits on ngram's stream, which never
    answers (its stub died); once the watchdog marks ngram down the request
    is retried on the fallback at once (nothing was streamed) instead of
    failing at its deadline."""
    import threading
    import time

    from tests.unit.test_inprocess_variants import FINAL, Response

    from trtspec.runtime import health
    from trtspec.runtime.threads import BlsStreams

    never = threading.Event()

    class Call:
        def __init__(self, model_name: str, **_: Any) -> None:
            self.model_name = model_name

        def exec(self, decoupled: bool = False) -> Any:
            if self.model_name == "ngram":
                never.wait(30)
                return iter([])
            final = [Tensor("text_output", np.array([b"ok"], dtype=np.object_))]
            final.append(Tensor("is_final", np.array([True])))
            return iter([Response(final)])

    monkeypatch.setattr(sys.modules["triton_python_backend_utils"], "InferenceRequest", Call)
    monkeypatch.setenv(health.DOWN_ENV, str(tmp_path))
    router._streams = BlsStreams()
    timer = threading.Timer(0.3, health.mark_down, args=(tmp_path, "ngram"))
    timer.start()
    request = Request("r-down")
    started = time.monotonic()
    router._serve(request)
    assert time.monotonic() - started < 2.0
    never.set()
    timer.join()
    (tensors, flags), *_ = request.sender.sent
    assert flags == FINAL and tensors["variant"][0] == b"baseline" and tensors["fallback"][0]
