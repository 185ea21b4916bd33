"""The router's metrics thread (``rollout_metrics.RouterMetrics``): updates
that queued up while it was busy are applied as one batch with the same end
state in fewer calls (each call is a round trip from the stub to
tritonserver), against a stand-in ``pb_utils.MetricFamily`` that records
every call."""

from __future__ import annotations

import json
import threading
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import Choice, load_routing
from trtspec.runtime.models.rollout_live import Live, Tracked
from trtspec.runtime.models.rollout_metrics import (
    INSTANCE_LABEL,
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
    metrics = RouterMetrics(pb, extra_labels={INSTANCE_LABEL: "router_0_1"})
    try:
        metrics.inc("trtspec_requests_total", A)
        metrics.set("trtspec_canary_percent", {"route": "r", "variant": "v"}, 5)
        metrics.inc("trtspec_log_dropped_lines_total", {}, 2)
        metrics.flush()
        made = {(c[1], c[2]) for c in Family.calls if c[0] == "made"}
        assert made == {
            (
                "trtspec_requests_total",
                tuple(sorted({**A, "router_instance": "router_0_1"}.items())),
            ),
            (
                "trtspec_canary_percent",
                (("route", "r"), ("router_instance", "router_0_1"), ("variant", "v")),
            ),
            ("trtspec_log_dropped_lines_total", (("router_instance", "router_0_1"),)),
        }
    finally:
        metrics.close()


def _router(tmp_path: Path) -> tuple[Path, Any]:
    router = tmp_path / "router"
    router.mkdir()
    routes = {"code": {"variant": "ngram", "canary_percent": 5}}
    (router / "routing.json").write_text(json.dumps({"schema_version": 1, "routes": routes}))
    return router, load_routing(router / "routing.json")


class _Stub:
    MetricFamily = Family

    class Logger:
        @staticmethod
        def log_warn(message: str) -> None:
            pass


def test_the_router_process_label_is_router_instance_not_prometheus_instance(
    tmp_path: Path,
) -> None:
    # Prometheus gives every scraped series `instance` (host:port of the
    # target); a series' own `instance` would be renamed exported_instance,
    # or with honor_labels: true replace the target's.
    router, table = _router(tmp_path)
    Family.calls, Family.gate = [], None
    live = Live(
        router, router / "routing.json", table, _Stub, st.RolloutConfig(), instance="router_0_1"
    )
    try:
        live.metrics.inc("trtspec_log_dropped_lines_total", {}, 1)
        live.metrics.flush()
        made = [dict(c[2]) for c in Family.calls if c[0] == "made"]
        assert made == [{"router_instance": "router_0_1"}]
    finally:
        live.close()


class _DroppingWriter:
    """A writer that has dropped 100 lines and drops every further one."""

    def __init__(self) -> None:
        self.dropped = 100

    def write(self, record: dict[str, Any]) -> bool:
        time.sleep(0.001)  # a thread switch here, as under load
        return False

    def close(self) -> None:
        pass


class _CountingMetrics:
    def __init__(self) -> None:
        self.dropped_total = 0.0

    def inc(self, name: str, labels: dict[str, str], value: float = 1.0) -> None:
        if name == "trtspec_log_dropped_lines_total":
            self.dropped_total += value
            time.sleep(0.001)  # the queue put lets another thread in

    def set(self, *args: Any) -> None:
        pass

    def observe(self, *args: Any) -> None:
        pass

    def close(self) -> None:
        pass


def test_dropped_lines_are_counted_once_by_threads_ending_together(tmp_path: Path) -> None:
    router, table = _router(tmp_path)
    live = Live(router, router / "routing.json", table, _Stub, st.RolloutConfig())
    live.close()
    live.writer = _DroppingWriter()  # type: ignore[assignment]
    counting = _CountingMetrics()
    live.metrics = counting  # type: ignore[assignment]
    tracked = Tracked()
    tracked.route, tracked.choice, tracked.begun = "other", Choice("v", "v", None, False), True
    threads = [threading.Thread(target=live.end, args=(tracked, None)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert counting.dropped_total == 100  # the writer's 100, not once per thread


def test_close_is_bounded_when_the_metrics_thread_is_stuck() -> None:
    pb = types.SimpleNamespace(MetricFamily=Family)
    Family.calls, Family.gate = [], threading.Event()
    Family.waiting.clear()
    metrics = RouterMetrics(pb, queue_size=2)
    try:
        metrics.inc("trtspec_requests_total", A)  # taken; the call hangs at the gate
        assert Family.waiting.wait(10)
        metrics.inc("trtspec_requests_total", B)
        metrics.inc("trtspec_requests_total", B)  # the queue is full now
        closing = threading.Thread(target=metrics.close, kwargs={"timeout": 0.5})
        started = time.monotonic()
        closing.start()
        closing.join(5)
        assert not closing.is_alive() and time.monotonic() - started < 2
    finally:
        Family.gate.set()
        Family.gate = None


def test_two_thousand_made_up_routes_add_a_handful_of_series(tmp_path: Path) -> None:
    """Issue 44: a route not in the routing table is counted under one fixed
    label value (``OTHER_ROUTE``): a client's 2,000 made-up routes (54,060
    series before) make the series of one route."""
    from trtspec.runtime.models.rollout_metrics import OTHER_ROUTE

    router, table = _router(tmp_path)
    Family.calls, Family.gate = [], None
    live = Live(router, router / "routing.json", table, _Stub, st.RolloutConfig())
    try:

        def serve(route: str, i: int) -> None:
            tracked = Tracked()
            live.begin(
                tracked,
                table=live.table(),
                route=route,
                request_id=f"r{i}",
                choice=Choice("baseline", "baseline", None, False),
                inputs={},
            )
            tracked.track({"completion_tokens": np.array([4], dtype=np.int32)}, True)
            live.end(tracked, None)

        serve("code", 0)  # a route of the table
        live.metrics.flush()
        known = {(c[1], c[2]) for c in Family.calls if c[0] == "made"}
        for i in range(2000):
            serve(f"made-up-{i}", i)
        live.metrics.flush()
        made = {(c[1], c[2]) for c in Family.calls if c[0] == "made"}
        routes = {dict(key).get("route") for _, key in made}
        assert routes == {"code", OTHER_ROUTE}, sorted(routes)[:5]
        # one route's worth of series more at most (no canary_percent: no rule)
        assert 0 < len(made - known) <= len(known) < 30, (len(made - known), len(known))
    finally:
        live.close()


def test_a_series_takes_at_most_max_label_sets_then_overflows() -> None:
    from trtspec.runtime.models.rollout_metrics import OVERFLOW

    pb = types.SimpleNamespace(MetricFamily=Family)
    Family.calls, Family.gate = [], None
    warnings: list[str] = []
    metrics = RouterMetrics(pb, warn=warnings.append)
    metrics.max_label_sets = 10
    try:
        for i in range(50):
            metrics.inc("trtspec_requests_total", {**A, "variant": f"v{i}"})
            metrics.observe("trtspec_latency_seconds", {**A, "variant": f"v{i}"}, 0.2)
        metrics.flush()
        made = [c for c in Family.calls if c[0] == "made"]
        requests = [dict(c[2]) for c in made if c[1] == "trtspec_requests_total"]
        assert len(requests) == 11
        assert {"route": OVERFLOW, "variant": OVERFLOW, "arm": OVERFLOW} in requests
        overflowed = state(Family.calls)
        key = tuple(sorted({"route": OVERFLOW, "variant": OVERFLOW, "arm": OVERFLOW}.items()))
        assert overflowed[("trtspec_requests_total", key)] == 40.0
        counts = [c for c in made if c[1] == "trtspec_latency_seconds_count"]
        assert len(counts) == 11
        assert warnings == [
            f"router: metric {name} has 10 label sets; further ones count under the value "
            "'(overflow)'"
            for name in ("trtspec_requests_total", "trtspec_latency_seconds")
        ]
    finally:
        metrics.close()
