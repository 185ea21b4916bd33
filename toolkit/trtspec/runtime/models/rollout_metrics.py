"""The router's Prometheus series, through Triton's custom-metrics API
(``pb_utils.MetricFamily`` in the Python backend; served on tritonserver's
``/metrics`` beside its own ``nv_*`` series). ``SERIES`` declares each one
once — name, kind, help, labels — and the Grafana dashboard
(``docs/grafana/trtspec-rollout.json``) is checked against it by a test.

A ``HISTOGRAM`` series (TTFT, latency) is served as the three counter
families Prometheus reads a histogram from, ``<name>_bucket`` (label ``le``,
cumulative), ``<name>_sum`` and ``<name>_count``, counted here: the stub's
own ``MetricFamily.HISTOGRAM`` takes one ``observe`` round trip per value,
two per request, and under load such round trips made the router's 2.51
stall likely (``RouterMetrics``). ``histogram_quantile`` over ``_bucket`` reads
them as it reads a histogram's (the dashboard does); the ``# TYPE`` lines
say counter. tests/integration/test_rollout_served.py reads the lines back
from the served ``/metrics``. Where a stub lacks ``MetricFamily`` the router
serves without metrics and says so once in the server log.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

LABELS = ("route", "variant", "arm")
# The ``route`` label of a request whose route is not in the routing table:
# a client chooses its route, and each value it made up would be a series
# of every metric (2,000 made-up routes were 54,060 series).
OTHER_ROUTE = "(other)"
# The most label sets one series takes; past it an update counts under a
# label set of OVERFLOW values (said once per series in the server log).
MAX_LABEL_SETS = 1000
OVERFLOW = "(overflow)"
# The label naming the router process when several serve (its Triton
# model_instance_name, e.g. router_0_1). Not ``instance``: Prometheus gives
# every scraped series ``instance`` (the target's host:port), and a series'
# own ``instance`` either becomes ``exported_instance`` or, with
# ``honor_labels: true``, replaces the target's.
INSTANCE_LABEL = "router_instance"
SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# a HISTOGRAM series is served as these counter families (histogram_updates)
HISTOGRAM_PARTS = (
    ("bucket", "cumulative count per le bound"),
    ("sum", "sum of the values"),
    ("count", "number of values"),
)


@dataclass(frozen=True)
class Series:
    name: str
    kind: str  # COUNTER | GAUGE | HISTOGRAM (pb_utils.MetricFamily kinds)
    help: str
    labels: tuple[str, ...] = LABELS


SERIES = {
    s.name: s
    for s in (
        Series("trtspec_requests_total", "COUNTER", "Requests the router finished."),
        Series("trtspec_errors_total", "COUNTER", "Requests that ended in an error."),
        Series("trtspec_fallbacks_total", "COUNTER", "Requests retried on the route's fallback."),
        Series("trtspec_in_flight", "GAUGE", "Requests in flight."),
        Series("trtspec_ttft_seconds", "HISTOGRAM", "Time to first token at the router."),
        Series("trtspec_latency_seconds", "HISTOGRAM", "End-to-end latency at the router."),
        Series("trtspec_generated_tokens_total", "COUNTER", "Completion tokens generated."),
        Series("trtspec_accepted_tokens_total", "COUNTER", "Draft tokens the target accepted."),
        Series("trtspec_draft_tokens_total", "COUNTER", "Draft tokens proposed."),
        Series(
            "trtspec_golden_checks_total",
            "COUNTER",
            "Golden prompts mirrored through variant and fallback at T=0, by result.",
            ("route", "variant", "result"),
        ),
        Series(
            "trtspec_canary_percent",
            "GAUGE",
            "Share of the route's traffic on its variant now.",
            ("route", "variant"),
        ),
        Series(
            "trtspec_rollout_state_refused_total",
            "COUNTER",
            "Rollout states the router refused (invalid, or for another routing table).",
            (),
        ),
        Series(
            "trtspec_log_dropped_lines_total",
            "COUNTER",
            "Request-log lines dropped (the writer fell behind, or the disk refused them).",
            (),
        ),
        # The sufficient statistics of the live speedup interval
        # (rollout.compare.welch): with them `trtspec rollout status
        # --prometheus` reaches the verdict the request log gives.
        Series(
            "trtspec_cost_requests_total",
            "COUNTER",
            "Successful requests with output tokens (the ones the speedup is measured on).",
        ),
        Series(
            "trtspec_log_cost_total",
            "COUNTER",
            "Sum over those requests of ln(latency in microseconds per output token).",
        ),
        Series(
            "trtspec_log_cost_squares_total",
            "COUNTER",
            "Sum over those requests of the square of ln(microseconds per output token).",
        ),
    )
}


Update = tuple[str, str, dict[str, str], float]


def coalesce(updates: list[Update]) -> list[Update]:
    """``updates`` (op, series, labels, value) with the same end state in
    fewer calls: a metric whose updates in the batch are all increments gets
    one increment of their sum (when it is 0, as a request's +1 and -1 of
    ``trtspec_in_flight``, a ``touch``: the metric is made, nothing is
    sent), all sets the last set, all observations of a histogram its
    counters' increments (``histogram_updates``); a metric with mixed kinds
    of update keeps them all, in order.
    Every metrics call is a round trip from the stub to tritonserver, and a
    finished request makes about ten: under load most of them go."""
    order: dict[tuple[str, tuple[tuple[str, str], ...]], list[Update]] = {}
    for update in updates:
        order.setdefault((update[1], tuple(sorted(update[2].items()))), []).append(update)
    out: list[Update] = []
    for group in order.values():
        ops = {u[0] for u in group}
        if ops == {"observe"}:
            _, name, labels, _ = group[0]
            out.extend(histogram_updates(name, labels, [u[3] for u in group]))
        elif ops == {"increment"}:
            _, name, labels, _ = group[0]
            total = sum(u[3] for u in group)
            # 0: made (it shows on /metrics) but not sent an increment
            out.append(("increment" if total else "touch", name, labels, total))
        elif ops == {"set"}:
            out.append(group[-1])
        else:
            out.extend(group)
    return out


def _le(bound: float) -> str:
    return f"{bound:g}"


def histogram_updates(name: str, labels: dict[str, str], values: list[float]) -> list[Update]:
    """Observations of the histogram ``name`` as increments of the three
    counter families Prometheus reads a histogram from: ``<name>_bucket``
    (cumulative, one per ``le`` bound and ``+Inf``), ``<name>_sum`` and
    ``<name>_count`` (a bound no value fell under is made, not sent)."""
    out: list[Update] = []
    for bound in SECONDS_BUCKETS:
        n = float(sum(1 for v in values if v <= bound))
        op = "increment" if n else "touch"
        out.append((op, f"{name}_bucket", {**labels, "le": _le(bound)}, n))
    count = float(len(values))
    out.append(("increment", f"{name}_bucket", {**labels, "le": "+Inf"}, count))
    total = float(sum(values))
    out.append(("increment" if total else "touch", f"{name}_sum", labels, total))
    out.append(("increment", f"{name}_count", labels, count))
    return out


class RouterMetrics:
    """One ``MetricFamily`` per series and one ``Metric`` per label set,
    made on first use. Every call to the metrics API happens on this
    object's own thread, fed by a bounded queue (a full queue drops the
    update): with calls from many request threads at once, tritonserver
    2.51's Python backend crashed (SIGSEGV in libtriton_python.so, seen in
    tests/integration/test_rollout_served.py), and one thread also keeps the
    stub's round trips off the request path; what queued up meanwhile is
    applied as one batch (``coalesce``), at most one batch every
    ``APPLY_EVERY_S`` (an update waits at most that long to show on
    /metrics; an idle router's goes out at once).

    Why so few calls: each is a round trip that the 2.51 stub makes holding
    the lock of its whole stub-to-parent channel (``Stub::SendMessage``,
    python_backend r24.10 src/pb_stub.h), the channel every BLS stream's
    cleanup and every ``is_cancelled()`` also goes through. With one metric
    call after another at ~10 a request, a router serving short requests
    at 16 or 64 in flight stalled for good in 4 of 5 runs (every engine
    call waiting for a first response the engine never got;
    docs/design/triton-limits.md); batched, with the histograms counted here, in 3
    of 8, as with metrics off (3 of 9). That stall is a lock-order deadlock
    in the stub's BLS stream handling (§9); the metrics' round trips only
    widened its window. ``pb_utils`` is passed in (the
    stub's module) so this imports nothing from Triton; ``enabled`` is False
    without the API (or with TRTSPEC_ROUTER_METRICS=0)."""

    def __init__(
        self,
        pb_utils: Any,
        warn: Any = None,
        queue_size: int = 100000,
        extra_labels: dict[str, str] | None = None,
    ) -> None:
        # Added to every metric's labels: ``router_instance`` (INSTANCE_LABEL)
        # when several router processes serve. Two processes creating a
        # family of one name get the same Prometheus family (Triton core
        # r24.10 metric_family.cc: prometheus-cpp's registry merges), and
        # with equal labels the same child, which the first process to
        # delete its metric (close) would free under the other; distinct
        # labels keep the children apart.
        self._extra = dict(extra_labels or {})
        self._pb = pb_utils
        self._metrics: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        # series -> the label sets it has taken (MAX_LABEL_SETS), by any thread
        self._label_sets: dict[str, set[tuple[tuple[str, str], ...]]] = {}
        self._label_lock = threading.Lock()
        self._overflowed: set[str] = set()
        self.max_label_sets = MAX_LABEL_SETS
        self.families: dict[str, Any] = {}
        self.dropped = 0
        self._warn = warn
        family_cls: Any = getattr(pb_utils, "MetricFamily", None)
        if os.environ.get("TRTSPEC_ROUTER_METRICS", "1") == "0":
            family_cls = None
        self.enabled = family_cls is not None
        if family_cls is None:
            if warn is not None:
                warn("router: this Python backend has no custom-metrics API; no trtspec_* metrics")
            return
        for s in SERIES.values():
            if s.kind == "HISTOGRAM":  # as three counter families, see histogram_updates
                for suffix, what in HISTOGRAM_PARTS:
                    self.families[f"{s.name}_{suffix}"] = family_cls(
                        name=f"{s.name}_{suffix}",
                        description=f"{s.help} ({what})",
                        kind=family_cls.COUNTER,
                    )
                continue
            self.families[s.name] = family_cls(
                name=s.name, description=s.help, kind=getattr(family_cls, s.kind)
            )
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._run, name="trtspec-metrics", daemon=True)
        self._thread.start()

    def _metric(self, name: str, labels: dict[str, str]) -> Any:
        key = (name, tuple(sorted(labels.items())))
        metric = self._metrics.get(key)
        if metric is None:
            metric = self.families[name].Metric(labels={**labels, **self._extra})
            self._metrics[key] = metric
        return metric

    def _bounded(self, name: str, labels: dict[str, str]) -> dict[str, str]:
        """``labels``, or every value OVERFLOW once ``name`` has taken
        ``max_label_sets`` other label sets."""
        key = tuple(sorted(labels.items()))
        with self._label_lock:
            taken = self._label_sets.setdefault(name, set())
            if key in taken or len(taken) < self.max_label_sets:
                taken.add(key)
                return labels
            first = name not in self._overflowed
            self._overflowed.add(name)
        if first and self._warn is not None:
            self._warn(
                f"router: metric {name} has {self.max_label_sets} label sets; "
                f"further ones count under the value {OVERFLOW!r}"
            )
        return {k: OVERFLOW for k in labels}

    def _put(self, op: str, name: str, labels: dict[str, str], value: float) -> None:
        if not self.enabled:
            return
        if labels:
            labels = self._bounded(name, labels)
        try:
            self._queue.put_nowait((op, name, labels, float(value)))
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        next_apply = 0.0
        while True:
            items = [self._queue.get()]
            # at most one batch per APPLY_EVERY_S: under load the updates of
            # that long go out together (an idle router's at once)
            wait = next_apply - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            # and whatever else queued up meanwhile, applied as one batch
            while len(items) < self.BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stop = None in items
            updates = [i for i in items if isinstance(i, tuple)]
            for op, name, labels, value in coalesce(updates):
                try:
                    metric = self._metric(name, labels)
                    if op != "touch":
                        getattr(metric, op)(value)
                except Exception as exc:  # a metric never fails the router
                    if self._warn is not None:
                        self._warn(f"router: metric {name}: {exc!r}")
            next_apply = time.monotonic() + self.APPLY_EVERY_S
            for item in items:
                if isinstance(item, threading.Event):
                    item.set()
            if stop:
                return

    # updates taken into one batch at most (each batch: one round trip to the
    # server per metric it changes)
    BATCH = 100000
    # seconds between two batches at least; see the class docstring
    APPLY_EVERY_S = 0.5

    def inc(self, name: str, labels: dict[str, str], value: float = 1.0) -> None:
        if value:
            self._put("increment", name, labels, value)

    def set(self, name: str, labels: dict[str, str], value: float) -> None:
        self._put("set", name, labels, value)

    def observe(self, name: str, labels: dict[str, str], value: float) -> None:
        self._put("observe", name, labels, value)

    def flush(self, timeout: float = 5.0) -> None:
        if self.enabled and self._thread.is_alive():
            done = threading.Event()
            try:
                self._queue.put(done, timeout=timeout)
            except queue.Full:
                return
            done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after what was queued, waiting about ``timeout``
        s at most in all: a thread stuck in a metrics call (its queue full)
        never holds the router's finalize."""
        if self.enabled:
            deadline = time.monotonic() + timeout
            with contextlib.suppress(queue.Full):
                self._queue.put(None, timeout=timeout)
            self._thread.join(max(0.0, deadline - time.monotonic()))
        # Metrics before their families (the stub refuses the other order).
        self._metrics.clear()
        self.families.clear()
