"""The router's metrics thread (``rollout_metrics.RouterMetrics``): updates
that queued up while it was busy are applied as one batch with the same end
state in fewer calls (each call is a round trip from the stub to
tritonserver), against a stand-in ``pb_utils.MetricFamily`` that records
every call."""

from __future__ import annotations

import threading
import types
from typing import Any, ClassVar

from trtspec.repo.models.rollout_metrics import SERIES, RouterMetrics, coalesce

A = {"route": "r", "variant": "v", "arm": "canary"}
B = {"route": "r", "variant": "base", "arm": "control"}


class Family:
    COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"
    calls: ClassVar[list[tuple[str, str, tuple[tuple[str, str], ...], float]]] = []
    gate: threading.Event | None = None  # holds the first call until set
    waiting = threading.Event()  # a call waits at the gate

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name

    def Metric(self, labels: dict[str, str], buckets: Any = None) -> Any:
        family, key = self, tuple(sorted(labels.items()))

        class Metric:
            def _call(self, op: str, value: float) -> None:
                if Family.gate is not None:
                    Family.waiting.set()
                    Family.gate.wait(10)
                Family.calls.append((op, family.name, key, value))

            def increment(self, value: float) -> None:
                self._call("increment", value)

            def set(self, value: float) -> None:
                self._call("set", value)

            def observe(self, value: float) -> None:
                self._call("observe", value)

        Family.calls.append(("made", family.name, key, 0.0))
        return Metric()


def state(calls: list[tuple[str, str, Any, float]]) -> dict[Any, Any]:
    """What /metrics would show: counters and gauges by value, histograms by
    their observations (sorted: the buckets do not keep an order)."""
    out: dict[Any, Any] = {}
    for op, name, key, value in calls:
        if op == "made":
            out.setdefault((name, key), [] if SERIES[name].kind == "HISTOGRAM" else 0.0)
        elif op == "increment":
            out[(name, key)] = out.get((name, key), 0.0) + value
        elif op == "set":
            out[(name, key)] = value
        else:
            out[(name, key)] = sorted([*out.get((name, key), []), value])
    return out


def test_coalesce_keeps_the_end_state_in_fewer_calls() -> None:
    updates = [
        ("increment", "trtspec_in_flight", A, 1.0),
        ("increment", "trtspec_requests_total", A, 1.0),
        ("observe", "trtspec_latency_seconds", A, 0.5),
        ("set", "trtspec_canary_percent", {"route": "r", "variant": "v"}, 5.0),
        ("increment", "trtspec_in_flight", A, -1.0),
        ("increment", "trtspec_requests_total", A, 1.0),
        ("increment", "trtspec_generated_tokens_total", B, 32.0),
        ("observe", "trtspec_latency_seconds", A, 0.25),
        ("set", "trtspec_canary_percent", {"route": "r", "variant": "v"}, 25.0),
        ("increment", "trtspec_requests_total", B, 1.0),
    ]
    assert coalesce(updates) == [
        ("touch", "trtspec_in_flight", A, 0.0),  # +1 -1: made, nothing sent
        ("increment", "trtspec_requests_total", A, 2.0),
        ("observe", "trtspec_latency_seconds", A, 0.5),
        ("observe", "trtspec_latency_seconds", A, 0.25),
        ("set", "trtspec_canary_percent", {"route": "r", "variant": "v"}, 25.0),
        ("increment", "trtspec_generated_tokens_total", B, 32.0),
        ("increment", "trtspec_requests_total", B, 1.0),
    ]
    mixed = [
        ("increment", "trtspec_in_flight", A, 1.0),
        ("set", "trtspec_in_flight", A, 7.0),
        ("increment", "trtspec_in_flight", A, 1.0),
    ]
    assert coalesce(mixed) == mixed  # order matters there: kept as is


def test_updates_that_queued_up_are_applied_together_with_the_same_result() -> None:
    pb = types.SimpleNamespace(MetricFamily=Family)
    Family.calls, Family.gate = [], threading.Event()
    metrics = RouterMetrics(pb)
    try:
        Family.waiting.clear()
        metrics.inc("trtspec_requests_total", B)  # the thread takes it and waits at the gate
        assert Family.waiting.wait(10)
        sequential: list[tuple[str, str, Any, float]] = []
        for i in range(50):  # fifty requests begin and end meanwhile
            for op, name, labels, value in (
                ("increment", "trtspec_in_flight", A, 1.0),
                ("increment", "trtspec_in_flight", A, -1.0),
                ("increment", "trtspec_requests_total", A, 1.0),
                ("increment", "trtspec_generated_tokens_total", A, 32.0),
                ("observe", "trtspec_ttft_seconds", A, 0.01 * i),
                ("set", "trtspec_canary_percent", {"route": "r", "variant": "v"}, float(i)),
            ):
                getattr(metrics, {"increment": "inc"}.get(op, op))(name, labels, value)
                sequential.append((op, name, tuple(sorted(labels.items())), value))
        Family.gate.set()
        metrics.flush()
        made = [c for c in Family.calls if c[0] == "made"]
        sent = [c for c in Family.calls if c[0] != "made"]
        expected = state(
            [("made", n, k, 0.0) for _, n, k, _ in sequential]
            + [
                (
                    "increment",
                    "trtspec_requests_total",
                    (("arm", "control"), ("route", "r"), ("variant", "base")),
                    1.0,
                )
            ]
            + sequential
        )
        assert state(Family.calls) == expected
        assert len(made) == 6  # every metric shows, in_flight included (at 0)
        # 1 + 50 observations + one sum per counter + the last set, not 301 calls
        assert len(sent) == 1 + 50 + 2 + 1, len(sent)
    finally:
        Family.gate = None
        metrics.close()


def test_a_lone_update_goes_out_as_it_came() -> None:
    pb = types.SimpleNamespace(MetricFamily=Family)
    Family.calls, Family.gate = [], None
    metrics = RouterMetrics(pb)
    try:
        metrics.inc("trtspec_in_flight", A, 1)
        metrics.flush()
        metrics.inc("trtspec_in_flight", A, -1)
        metrics.flush()
        key = tuple(sorted(A.items()))
        assert [c for c in Family.calls if c[0] != "made"] == [
            ("increment", "trtspec_in_flight", key, 1.0),
            ("increment", "trtspec_in_flight", key, -1.0),
        ]
    finally:
        metrics.close()
