"""What the router does for the rollout around each request: the routing
table of the moment (``StateWatcher``: a change made by ``trtspec rollout``
applies to the next request, with no restart, while requests in flight keep
the variant they were given), one ``Tracked`` per request (first token,
final stats, the variant that answered), and at its end one log line, the
Prometheus series, the route's live window and, every ``golden_every``
requests of a route on a canary, a golden prompt mirrored through the variant
and its fallback at temperature 0 on a background thread. A golden mismatch,
or an error-rate or p95 breach over the window, sends the route back to its
fallback (``state.change``, recorded in the history) when the rollout's
``auto_rollback`` is on. The router model holds one ``Live`` and calls
``table``, ``begin``, ``Tracked.track`` and ``end``; nothing here may fail a
request, so every failure of this bookkeeping is logged and swallowed.
Imports nothing from Triton: the stub's ``pb_utils`` is passed in.

On Kubernetes (``artifacts.rollout_kube``: the pod names its rollout ConfigMap)
the rollout folder is that ConfigMap's read-only volume: a rollback is
patched into the ConfigMap through the API server, the object is read back
every ``rollout_kube.poll_s()`` seconds (so a change by any replica or the
CLI reaches this one within that, whatever kubelet's sync period), the
request log goes to stdout and the golden log to stderr (the cluster's log
collector), and locks and shared counts go to a scratch folder. A rollback
this process decided is served here at once, and until it is in the shared
state it is retried at every poll (``pending``), so a replica that cannot
reach the API server still stops sending the route to its variant.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.artifacts import rollout_kube
from trtspec.artifacts import rollout_state as st
from trtspec.artifacts.routing import Choice, RoutingTable
from trtspec.runtime.models.rollout_log import FIELDS, TIME_FIELD, LineWriter, lock_path
from trtspec.runtime.models.rollout_metrics import INSTANCE_LABEL, OTHER_ROUTE, RouterMetrics
from trtspec.runtime.rollout_window import CANARY, CONTROL, arm_window, breaches
from trtspec.runtime.threads import BlsStreams

# The live window is checked for a breach after every this many requests of a route.
CHECK_EVERY = 5
AUTO = "router (automatic)"


class Tracked:
    """One request as the router sees it; ``sent`` counts responses relayed
    (the router's fallback rule reads it)."""

    def __init__(self) -> None:
        self.sent = 0
        self.start_ns = time.monotonic_ns()
        self.first_ns: int | None = None
        self.final: dict[str, Any] = {}
        self.route: str | None = None
        self.request_id = ""
        self.choice: Choice | None = None
        self.rule_variant: str | None = None
        self.temperature: float | None = None
        self.prompt: str | None = None
        self.begun = False

    def track(self, tensors: dict[str, np.ndarray], is_final: bool) -> None:
        try:
            if self.first_ns is None:
                ids = tensors.get("output_ids")
                text = tensors.get("text_output")
                has_ids = ids is not None and ids.size > 0
                has_text = text is not None and text.size > 0 and bool(text.reshape(-1)[0])
                if has_ids or has_text:
                    self.first_ns = time.monotonic_ns()
            if is_final:
                self.final = {
                    k: _scalar(v)
                    for k, v in tensors.items()
                    if k not in ("output_ids", "text_output")
                }
        except Exception:  # bookkeeping never fails a request
            self.final = self.final or {}


def _scalar(array: np.ndarray) -> Any:
    if not array.size:
        return None
    value = array.reshape(-1)[0]
    return value.item() if isinstance(value, np.generic) else value


def _int(value: Any) -> int | None:
    """A reported count; None when absent or negative (not reported)."""
    if value is None:
        return None
    value = int(value)
    return value if value >= 0 else None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def log_cost_us(rec: dict[str, Any]) -> float | None:
    """ln(microseconds per output token) of a successful request, at least
    0 (a counter never goes down); None when it has no tokens. In
    microseconds so that every real request is above 0; the speedup
    interval does not depend on the unit (rollout.compare.Moments)."""
    tokens, latency = rec.get("completion_tokens"), rec.get("latency_ms")
    if rec.get("error") is not None or not tokens or not latency or latency <= 0:
        return None
    return max(0.0, math.log(float(latency) * 1000.0 / int(tokens)))


def rolled_back(table: RoutingTable, routes: set[str]) -> RoutingTable:
    """``table`` with ``routes`` sent wholly to their fallback."""
    import dataclasses

    changed = {
        name: dataclasses.replace(rule, canary_percent=0.0)
        for name, rule in table.routes.items()
        if name in routes
    }
    return dataclasses.replace(table, routes={**table.routes, **changed}) if changed else table


class Live:
    def __init__(
        self,
        router_dir: Path,
        routing_path: Path,
        table: RoutingTable,
        pb_utils: Any,
        config: st.RolloutConfig | None = None,
        *,
        instance: str | None = None,
    ) -> None:
        """``instance``: this router process's name when the server runs
        several (each metric then carries it as the label
        ``router_instance``, ``INSTANCE_LABEL``, and the live windows hold
        the requests this process served)."""
        self.pb = pb_utils
        self.config = config or st.RolloutConfig.load(router_dir)
        self.folder = st.rollout_dir(router_dir)
        self.kube = rollout_kube.HttpConfigMap.from_env()
        self.scratch = rollout_kube.scratch_dir(self.folder)
        self.routing_path = Path(routing_path)
        # route -> (why, details) of a rollback decided here and not yet in
        # the shared state; served as rolled back meanwhile
        self.pending: dict[str, tuple[str, dict[str, Any]]] = {}
        self.metrics = RouterMetrics(
            pb_utils,
            warn=self._warn,
            extra_labels={INSTANCE_LABEL: instance} if instance else None,
        )
        self.watcher = st.StateWatcher(
            table,
            routing_path,
            self.folder,
            warn=self._warn,
            refused=lambda: self.metrics.inc("trtspec_rollout_state_refused_total", {}),
        )
        log = self.config.log
        self.writer: LineWriter | None = None
        self.golden_writer: LineWriter | None = None
        # a ConfigMap volume is read-only: the logs go to the pod's streams
        in_pod = self.kube is not None
        if log.get("destination") != "off":
            to_file = log.get("destination") == "file" and not in_pod
            self.writer = LineWriter(
                self.folder / st.LOG_FILE if to_file else None,
                max_bytes=int(log["max_bytes"]),
                backups=int(log["backups"]),
                queue_size=int(log["queue"]),
                stream=None if to_file else sys.stdout,
                # to stdout: the router processes take turns on the log's lock
                lock=None if to_file else lock_path(self.scratch / st.LOG_FILE),
            )
        if self.config.golden and self.config.golden_every > 0:
            self.golden_writer = LineWriter(
                None if in_pod else self.folder / st.GOLDEN_FILE,
                max_bytes=int(log["max_bytes"]),
                backups=1,
                stream=sys.stderr if in_pod else None,
                lock=lock_path(self.scratch / st.GOLDEN_FILE) if in_pod else None,
            )
        self._lock = threading.Lock()
        n = self.config.window_requests
        self._windows: dict[tuple[str, str], collections.deque[dict[str, Any]]] = (
            collections.defaultdict(lambda: collections.deque(maxlen=n))
        )
        self._counts: collections.Counter[str] = collections.Counter()
        self._golden_busy: set[str] = set()
        self._golden_threads: list[threading.Thread] = []
        # the writer's drops already counted in the metric (request threads
        # read-and-advance it together, under _dropped_lock)
        self._dropped_seen = 0
        self._dropped_lock = threading.Lock()
        self._streams = BlsStreams()
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None
        self._poll_error: str | None = None
        if self.kube is not None:
            with contextlib.suppress(OSError):
                self.scratch.mkdir(parents=True, exist_ok=True)
            self._poll_once()  # the shared state before the first request
            self._poller = threading.Thread(
                target=self._poll, name="trtspec-rollout-poll", daemon=True
            )
            self._poller.start()

    # -- the router's calls ------------------------------------------------
    def table(self) -> RoutingTable:
        try:
            table = self.watcher.table()
        except Exception as exc:  # bookkeeping never fails a request
            self._warn(f"rollout: reading the state: {exc!r}; keeping the last routing state")
            table = self.watcher.last()
        if not self.pending:
            return table
        state = self.watcher.state
        for route in list(self.pending):
            shared = state.routes.get(route) if state is not None else None
            if shared is not None and shared.status == st.ROLLED_BACK:
                self.pending.pop(route, None)  # the shared state has it now
        return rolled_back(table, set(self.pending))

    def begin(
        self,
        tracked: Tracked,
        *,
        table: RoutingTable,
        route: str | None,
        request_id: str,
        choice: Choice,
        inputs: dict[str, np.ndarray],
    ) -> None:
        try:
            tracked.route, tracked.request_id, tracked.choice = route, request_id, choice
            rule = table.routes.get(route or "")
            tracked.rule_variant = rule.variant if rule is not None else None
            temp = inputs.get("temperature")
            tracked.temperature = float(temp.reshape(-1)[0]) if temp is not None else None
            if self.config.log.get("prompts") and "text_input" in inputs:
                tracked.prompt = _text(inputs["text_input"].reshape(-1)[0])
            tracked.begun = True
            key = (route or "", choice.variant, CANARY if choice.canary else CONTROL)
            # +1 / -1 rather than a set(count): the metrics thread applies
            # updates in queue order, which need not be the order of counting
            self.metrics.inc("trtspec_in_flight", self._labels(*key), 1)
        except Exception as exc:  # bookkeeping never fails a request
            self._warn(f"rollout: begin: {exc!r}")

    def end(self, tracked: Tracked, error: str | None) -> None:
        try:
            if tracked.begun:
                self._end(tracked, error)
            elif self.writer is not None:  # refused before routing (bad input)
                self.writer.write(self.record(tracked, error))
        except Exception as exc:
            self._warn(f"rollout: end: {exc!r}")

    def close(self) -> None:
        self._stop.set()
        if self._poller is not None:
            self._poller.join(timeout=10)
        for t in self._golden_threads:
            t.join(timeout=5)
        for w in (self.writer, self.golden_writer):
            if w is not None:
                w.close()
        self._streams.close()
        self.metrics.close()

    # -- per request -------------------------------------------------------
    def _labels(self, route: str, variant: str, arm: str) -> dict[str, str]:
        # label values from the routing table only (OTHER_ROUTE: a client's own route)
        known = not route or route in self.watcher.base.routes
        return {"route": route if known else OTHER_ROUTE, "variant": variant, "arm": arm}

    def record(self, tracked: Tracked, error: str | None) -> dict[str, Any]:
        """The log line of a finished request (``FIELDS``, in order)."""
        choice = tracked.choice
        final = tracked.final
        variant = (
            _text(final["variant"])
            if final.get("variant") is not None
            else (choice.variant if choice is not None else None)
        )
        facts = self.config.variants.get(variant or "", {})
        k = None
        if facts.get("speculative") and choice is not None:
            k = (
                choice.num_draft_tokens
                if choice.num_draft_tokens is not None and variant == choice.variant
                else facts.get("num_speculative_tokens")
            )
        end_ns = time.monotonic_ns()
        latency_ms = (end_ns - tracked.start_ns) / 1e6
        completion = _int(final.get("completion_tokens"))
        ok = error is None
        values = {
            "route": tracked.route,
            "model": self.config.model or None,
            "speculative": bool(facts.get("speculative", False)),
            "draft_model": facts.get("draft_model"),
            "num_speculative_tokens": k,
            "temperature": tracked.temperature,
            "prompt_tokens": _int(final.get("prompt_tokens")),
            "completion_tokens": completion,
            "ttft_ms": (
                round((tracked.first_ns - tracked.start_ns) / 1e6, 3)
                if tracked.first_ns is not None and ok
                else None
            ),
            "latency_ms": round(latency_ms, 3) if ok else None,
            "tokens_per_second": (
                round(completion / (latency_ms / 1000.0), 3)
                if ok and completion and latency_ms > 0
                else None
            ),
            "accepted_tokens": _int(final.get("accepted_tokens")),
            "draft_tokens": _int(final.get("draft_tokens")),
            "request_id": tracked.request_id or None,
            "variant": variant,
            "arm": None if choice is None else (CANARY if choice.canary else CONTROL),
            "fallback": bool(final.get("fallback", False)),
            "error": error,
        }
        out = {name: values[name] for name in FIELDS}
        if tracked.prompt is not None:
            out["prompt"] = tracked.prompt
        out[TIME_FIELD] = round(time.time(), 3)
        return out

    def _end(self, tracked: Tracked, error: str | None) -> None:
        rec = self.record(tracked, error)
        choice = tracked.choice
        assert choice is not None
        route = tracked.route or ""
        key = (route, choice.variant, rec["arm"])
        self.metrics.inc("trtspec_in_flight", self._labels(*key), -1)
        if self.writer is not None:
            self.writer.write(rec)
            with self._dropped_lock:
                dropped = self.writer.dropped
                new = dropped - self._dropped_seen
                if new > 0:
                    self._dropped_seen = dropped
            if new > 0:
                self.metrics.inc("trtspec_log_dropped_lines_total", {}, new)
        labels = self._labels(route, rec["variant"], rec["arm"])
        self.metrics.inc("trtspec_requests_total", labels)
        if error is not None:
            self.metrics.inc("trtspec_errors_total", labels)
        if rec["fallback"]:
            self.metrics.inc("trtspec_fallbacks_total", labels)
        if rec["ttft_ms"] is not None:
            self.metrics.observe("trtspec_ttft_seconds", labels, rec["ttft_ms"] / 1000.0)
        if rec["latency_ms"] is not None:
            self.metrics.observe("trtspec_latency_seconds", labels, rec["latency_ms"] / 1000.0)
        self.metrics.inc("trtspec_generated_tokens_total", labels, rec["completion_tokens"] or 0)
        self.metrics.inc("trtspec_accepted_tokens_total", labels, rec["accepted_tokens"] or 0)
        self.metrics.inc("trtspec_draft_tokens_total", labels, rec["draft_tokens"] or 0)
        cost = log_cost_us(rec)
        if cost is not None:
            self.metrics.inc("trtspec_cost_requests_total", labels)
            self.metrics.inc("trtspec_log_cost_total", labels, cost)
            self.metrics.inc("trtspec_log_cost_squares_total", labels, cost * cost)
        table = self.table()
        rule = table.routes.get(route)
        if rule is None or rule.variant == rule.fallback_variant:
            return
        self.metrics.set(
            "trtspec_canary_percent",
            {"route": route, "variant": rule.variant},
            rule.canary_percent,
        )
        if not rule.canary_percent > 0:
            return
        with self._lock:
            self._windows[(route, rec["arm"])].append(rec)
            self._counts[route] += 1
            n = self._counts[route]
        if self.config.auto_rollback and rule.canary_percent < 100 and n % CHECK_EVERY == 0:
            self._check_window(table, route)
        every = self.config.golden_every
        if every > 0 and n % every == 0 and self.config.golden.get(route):
            self._start_golden(table, route, n // every)

    def _check_window(self, table: RoutingTable, route: str) -> None:
        with self._lock:
            canary = list(self._windows[(route, CANARY)])
            control = list(self._windows[(route, CONTROL)])
        reasons, _ = breaches(
            arm_window(canary),
            arm_window(control),
            self.config.thresholds,
            self.config.min_requests,
        )
        if reasons:
            self.rollback(table, route, "; ".join(reasons), {"trigger": "window"})

    def rollback(
        self, table: RoutingTable, route: str, why: str, details: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Send ``route`` to its fallback (once), recorded in the history;
        served so here at once even when the shared state cannot be written
        (then retried, ``pending``)."""
        if route in self.pending:
            return None
        self.pending[route] = (why, details)
        self._warn(f"rollout: route {route!r} rolled back to its fallback: {why}")
        with self._lock:
            self._windows.pop((route, CANARY), None)
            self._windows.pop((route, CONTROL), None)
        return self._persist(route)

    def _persist(self, route: str) -> dict[str, Any] | None:
        """Write the pending rollback of ``route`` to the shared state (the
        ConfigMap, else the rollout folder); the history entry, or None when
        it is not written (yet) or was already there."""
        held = self.pending.get(route)
        if held is None:
            return None
        why, details = held
        args: dict[str, Any] = {
            "percent": 0.0,
            "status": st.ROLLED_BACK,
            "action": "rollback",
            "by": AUTO,
            "why": why,
            "details": details,
            "only_if": lambda now: now.status != st.ROLLED_BACK,
        }
        try:
            if self.kube is not None:
                done = rollout_kube.change(
                    self.kube, self.watcher.digest, self.watcher.base, route, **args
                )
                entry = None
                if done is not None:
                    entry, state = done
                    self.watcher.offer(state)
            else:
                entry = st.change(self.folder, self.routing_path, self.watcher.base, route, **args)
                self.watcher.refresh(force=True)
        except Exception as exc:  # kept pending: retried at the next poll
            where = "the API server" if self.kube is not None else str(self.folder)
            self._warn(
                f"rollout: the rollback of route {route!r} is served by this router but "
                f"could not be recorded in {where} ({exc}); other replicas keep the route "
                "until it is"
            )
            return None
        self.pending.pop(route, None)
        return entry

    def _poll_once(self) -> None:
        assert self.kube is not None
        for route in list(self.pending):
            self._persist(route)
        try:
            cm = self.kube.get()
            state = rollout_kube.state_of(cm, f"configmap {self.kube.namespace}/{self.kube.name}")
        except Exception as exc:  # the mounted copy still serves
            # said once per kind of failure, not at every poll
            if str(exc) != self._poll_error:
                self._poll_error = str(exc)
                self._warn(
                    f"rollout: reading the shared state: {exc}; serving the mounted copy "
                    "until the API server answers"
                )
            return
        if self._poll_error is not None:
            self._poll_error = None
            self._warn("rollout: the API server answers again")
        self.watcher.offer(state)

    def _poll(self) -> None:
        while not self._stop.wait(rollout_kube.poll_s()):
            self._poll_once()

    # -- golden diff -------------------------------------------------------
    def _start_golden(self, table: RoutingTable, route: str, index: int) -> None:
        with self._lock:
            if route in self._golden_busy:
                return
            self._golden_busy.add(route)
        t = threading.Thread(
            target=self._golden, args=(table, route, index), name="trtspec-golden", daemon=True
        )
        self._golden_threads = [x for x in self._golden_threads if x.is_alive()] + [t]
        t.start()

    def _golden(self, table: RoutingTable, route: str, index: int) -> None:
        try:
            rule = table.routes[route]
            prompts = self.config.golden[route]
            i = index % len(prompts)
            outputs: dict[str, str] = {}
            try:
                for variant, k in (
                    (rule.variant, rule.num_draft_tokens),
                    (rule.fallback_variant, None),
                ):
                    outputs[variant] = self.generate(variant, prompts[i], route, k)
            except Exception as exc:
                self._golden_line(route, rule.variant, i, "error", {"error": str(exc)})
                return
            got, want = outputs[rule.variant], outputs[rule.fallback_variant]
            if got == want:
                self._golden_line(route, rule.variant, i, "match", {})
                return
            both = {"variant_output": got[:2000], "fallback_output": want[:2000]}
            self._golden_line(route, rule.variant, i, "mismatch", both)
            if self.config.auto_rollback:
                self.rollback(
                    table,
                    route,
                    f"golden prompt {i}: {rule.variant} output differs from "
                    f"{rule.fallback_variant} at temperature 0",
                    {"trigger": "golden", "golden_prompt": i, **both},
                )
        except Exception as exc:
            self._warn(f"rollout: golden check on {route!r}: {exc!r}")
        finally:
            with self._lock:
                self._golden_busy.discard(route)

    def _golden_line(
        self, route: str, variant: str, i: int, result: str, extra: dict[str, Any]
    ) -> None:
        self.metrics.inc(
            "trtspec_golden_checks_total", {"route": route, "variant": variant, "result": result}
        )
        if self.golden_writer is not None:
            self.golden_writer.write(
                {
                    TIME_FIELD: round(time.time(), 3),
                    "route": route,
                    "variant": variant,
                    "golden_prompt": i,
                    "result": result,
                    **extra,
                }
            )

    def generate(self, variant: str, text: str, route: str, k: int | None) -> str:
        """The whole text ``variant`` answers ``text`` with at temperature 0
        (a BLS call, not streamed)."""
        from trtspec.runtime.contract import ORCHESTRATOR_OUTPUTS
        from trtspec.runtime.threads import stream_timeout_us

        pb = self.pb
        max_tokens = self.config.golden_max_tokens
        arrays = {
            "text_input": np.array([text.encode("utf-8")], dtype=np.object_),
            "max_tokens": np.array([max_tokens], dtype=np.int32),
            "temperature": np.array([0.0], dtype=np.float32),
            "stream": np.array([False], dtype=np.bool_),
            "route": np.array([route.encode("utf-8")], dtype=np.object_),
            "request_id": np.array([f"golden-{uuid.uuid4().hex}".encode()], dtype=np.object_),
        }
        if k is not None:
            arrays["num_draft_tokens"] = np.array([k], dtype=np.int32)
        request = pb.InferenceRequest(
            model_name=variant,
            inputs=[pb.Tensor(name, a) for name, a in arrays.items()],
            requested_output_names=[t.name for t in ORCHESTRATOR_OUTPUTS],
            timeout=stream_timeout_us(max_tokens),
        )
        parts: list[str] = []
        responses = request.exec(decoupled=True)
        for response in responses:
            if response.has_error():
                raise RuntimeError(f"{variant}: {response.error().message()}")
            out = pb.get_output_tensor_by_name(response, "text_output")
            if out is not None and out.as_numpy().size:
                parts.append(_text(out.as_numpy().reshape(-1)[0]))
        self._streams.keep(responses)  # see BlsStreams
        return "".join(parts)

    def _warn(self, message: str) -> None:
        try:
            self.pb.Logger.log_warn(message)
        except Exception:
            print(message, file=sys.stderr)
