"""The router's metrics thread (``rollout_metrics.RouterMetrics``): updates
that queued up while it was busy are applied as one batch with the same end
state in fewer calls (each call is a round trip from the stub to
tritonserver), against a stand-in ``pb_utils.MetricFamily`` that records
every call."""

from __future__ import annotations

import threading
import types
from typing import Any, ClassVar

from trtspec.repo.models.rollout_metrics import (
    SECONDS_BUCKETS,
    RouterMetrics,
    coalesce,
    histogram_updates,
)

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


def state(calls: list[tuple[str, str, Any, float]]) -> dict[Any, float]:
    """What /metrics would show: every metric made, by value."""
    out: dict[Any, float] = {}
    for op, name, key, value in calls:
        if op == "made":
            out.setdefault((name, key), 0.0)
        elif op == "increment":
            out[(name, key)] = out.get((name, key), 0.0) + value
        elif op == "set":
            out[(name, key)] = value
        else:  # observe: one value, as the histogram's counters would count it
            for u in histogram_updates(name, dict(key), [value]):
                k = (u[1], tuple(sorted(u[2].items())))
                out[k] = out.get(k, 0.0) + u[3]
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
    buckets = [
        (
            "touch" if le < 0.25 else "increment",
            "trtspec_latency_seconds_bucket",
            {**A, "le": f"{le:g}"},
            0.0 if le < 0.25 else (1.0 if le < 0.5 else 2.0),
        )
        for le in SECONDS_BUCKETS
    ]
    assert coalesce(updates) == [
        ("touch", "trtspec_in_flight", A, 0.0),  # +1 -1: made, nothing sent
        ("increment", "trtspec_requests_total", A, 2.0),
        # two observations: cumulative buckets, +Inf, sum and count
        *buckets,
        ("increment", "trtspec_latency_seconds_bucket", {**A, "le": "+Inf"}, 2.0),
        ("increment", "trtspec_latency_seconds_sum", A, 0.75),
        ("increment", "trtspec_latency_seconds_count", A, 2.0),
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
            [("made", n, k, 0.0) for op, n, k, _ in sequential if op != "observe"]
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
        # every metric shows, in_flight at 0 and each histogram bound included:
        # five series and TTFT's 14 buckets, sum and count
        assert len(made) == 5 + 16
        # the first call, then one per changed metric: 2 counters, the
        # histogram's 16 and the last set, where one at a time took 301
        assert len(sent) == 1 + 2 + 16 + 1, len(sent)
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


def test_several_router_processes_label_every_metric_with_their_instance() -> None:
    # Two processes' families of one name share a Prometheus family in
    # tritonserver; only distinct labels keep one's metric from being the
    # other's (which the first to close would free).
    pb = types.SimpleNamespace(MetricFamily=Family)
    Family.calls, Family.gate = [], None
    metrics = RouterMetrics(pb, extra_labels={"instance": "router_0_1"})
    try:
        metrics.inc("trtspec_requests_total", A)
        metrics.set("trtspec_canary_percent", {"route": "r", "variant": "v"}, 5)
        metrics.inc("trtspec_log_dropped_lines_total", {}, 2)
        metrics.flush()
        made = {(c[1], c[2]) for c in Family.calls if c[0] == "made"}
        assert made == {
            ("trtspec_requests_total", tuple(sorted({**A, "instance": "router_0_1"}.items()))),
            (
                "trtspec_canary_percent",
                (("instance", "router_0_1"), ("route", "r"), ("variant", "v")),
            ),
            ("trtspec_log_dropped_lines_total", (("instance", "router_0_1"),)),
        }
    finally:
        metrics.close()
