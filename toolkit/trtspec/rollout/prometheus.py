"""``trtspec rollout status --prometheus URL``: a route's canary and control
windows read from the router's series in a Prometheus that scrapes every
router pod (the ServiceMonitor ``trtspec deploy k8s`` writes), summed over
the pods, over the last ``range_s`` seconds, and judged by
``rollout.compare.judge`` with the same thresholds as the request log is.

Per arm (label ``arm``): requests and errors (``increase`` of the
counters), TTFT and latency p50/p95 (``histogram_quantile`` over the
``_bucket`` counters: bucket-interpolated, so near the request log's exact
percentiles, not equal to them), tokens/s (tokens over summed latency: a
mean rate, where the log gives the median of per-request rates),
acceptance, and the speedup interval from the count, sum and sum of
squares of the log cost (``trtspec_cost_requests_total``,
``trtspec_log_cost_total``, ``trtspec_log_cost_squares_total``), which is
the interval the request log gives over the same requests.

Queries go to Prometheus's HTTP API (``GET /api/v1/query``, an instant
vector; prometheus/prometheus ``docs/querying/api.md``: ``{"status":
"success", "data": {"resultType": "vector", "result": [{"metric": {...},
"value": [<time>, "<value>"]}]}}``, ``"status": "error"`` with ``error``
otherwise). A URL off loopback is the user's choice (it names their own
Prometheus); nothing here listens.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from trtspec.errors import RepoError
from trtspec.rollout.compare import Comparison, Moments, judge, welch
from trtspec.runtime.rollout_window import CANARY, CONTROL, ArmWindow

Query = Callable[[str], list[dict[str, Any]]]
TIMEOUT_S = 30.0


def http_query(url: str, timeout_s: float = TIMEOUT_S) -> Query:
    """A ``Query`` against the Prometheus at ``url``."""
    base = url.rstrip("/")

    def run(promql: str) -> list[dict[str, Any]]:
        target = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(target, timeout=timeout_s) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            try:
                body = json.loads(exc.read())
            except ValueError:
                body = {"status": "error", "error": f"HTTP {exc.code}"}
        except (OSError, ValueError) as exc:
            raise RepoError(
                f"Prometheus at {base} did not answer: {exc}",
                "Pass the URL of the Prometheus that scrapes the router pods "
                "(e.g. `kubectl port-forward svc/prometheus 9090` and --prometheus "
                "http://127.0.0.1:9090).",
            ) from exc
        if body.get("status") != "success":
            raise RepoError(
                f"Prometheus at {base} refused {promql!r}: {body.get('error')}",
                "Check that it scrapes the router's series (trtspec_requests_total).",
            )
        data = body.get("data") or {}
        if data.get("resultType") != "vector":
            raise RepoError(f"Prometheus at {base}: {promql!r} gave no instant vector")
        result: list[dict[str, Any]] = data.get("result") or []
        return result

    return run


def _label(value: str) -> str:
    return json.dumps(value)  # a PromQL string literal: "..." with \" and \\ escapes


def queries(route: str, range_s: float) -> dict[str, str]:
    """Every PromQL query one route's status sends, by what it measures."""
    sel = f"{{route={_label(route)}}}"
    window = f"[{max(1, int(range_s))}s]"

    def total(series: str) -> str:
        return f"sum by (arm) (increase({series}{sel}{window}))"

    def quantile(q: float, series: str) -> str:
        return f"histogram_quantile({q}, sum by (arm, le) (increase({series}_bucket{sel}{window})))"

    return {
        "requests": total("trtspec_requests_total"),
        "errors": total("trtspec_errors_total"),
        "ttft_p50": quantile(0.5, "trtspec_ttft_seconds"),
        "ttft_p95": quantile(0.95, "trtspec_ttft_seconds"),
        "latency_p50": quantile(0.5, "trtspec_latency_seconds"),
        "latency_p95": quantile(0.95, "trtspec_latency_seconds"),
        "latency_sum": total("trtspec_latency_seconds_sum"),
        "tokens": total("trtspec_generated_tokens_total"),
        "accepted": total("trtspec_accepted_tokens_total"),
        "drafted": total("trtspec_draft_tokens_total"),
        "cost_n": total("trtspec_cost_requests_total"),
        "cost_sum": total("trtspec_log_cost_total"),
        "cost_squares": total("trtspec_log_cost_squares_total"),
    }


def _by_arm(result: list[dict[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for sample in result:
        arm = (sample.get("metric") or {}).get("arm")
        try:
            value = float(sample["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if arm in (CANARY, CONTROL) and math.isfinite(value):
            out[arm] = out.get(arm, 0.0) + value
    return out


def measure(
    query: Query, route: str, range_s: float
) -> tuple[ArmWindow, ArmWindow, Moments, Moments]:
    """Each arm's window and log-cost moments for ``route``."""
    got = {name: _by_arm(query(promql)) for name, promql in queries(route, range_s).items()}

    def arm(name: str) -> tuple[ArmWindow, Moments]:
        def value(key: str) -> float | None:
            return got[key].get(name)

        requests = round(value("requests") or 0.0)
        errors = min(requests, round(value("errors") or 0.0))
        ms = {k: (v * 1000.0 if (v := value(k)) is not None else None) for k in got}
        tokens, latency_s = value("tokens"), value("latency_sum")
        drafted = value("drafted")
        window = ArmWindow(
            requests=requests,
            errors=errors,
            error_rate=errors / requests if requests else None,
            ttft_p50_ms=ms["ttft_p50"],
            ttft_p95_ms=ms["ttft_p95"],
            latency_p50_ms=ms["latency_p50"],
            latency_p95_ms=ms["latency_p95"],
            tokens_per_second=tokens / latency_s if tokens and latency_s else None,
            acceptance=(value("accepted") or 0.0) / drafted if drafted else None,
        )
        moments = Moments.from_sums(
            value("cost_n") or 0.0, value("cost_sum") or 0.0, value("cost_squares") or 0.0
        )
        return window, moments

    can, can_m = arm(CANARY)
    con, con_m = arm(CONTROL)
    return can, con, can_m, con_m


def compare_from_prometheus(
    query: Query,
    route: str,
    range_s: float,
    thresholds: dict[str, float],
    min_requests: int,
) -> Comparison:
    """The route's verdict from the router's series (``judge``)."""
    can, con, can_m, con_m = measure(query, route, range_s)
    return judge(
        route,
        can,
        con=con,
        est=welch(can_m, con_m),
        thresholds=thresholds,
        min_requests=min_requests,
    )
