"""Canary vs control on live traffic, over a window of a route's most recent
requests (log records, ``trtspec.runtime.models.rollout_log.FIELDS``), judged with the
bench's thresholds (spec ``bench.decision``).

Live requests are not paired — each arm serves different prompts, drawn from
the same traffic by the request-id hash — so the speedup is the ratio of the
arms' geometric mean cost (ms per output token), control over canary, with a
Welch t interval on the difference of mean log costs (the t quantile of
``trtspec.bench.sequential``, whose ``verdict`` reads it exactly as the bench
reads a paired interval). The verdict:

- ``rollback`` — a breach: the canary's error rate is above
  ``max_error_rate`` (and above the control's), or its p95 latency is more
  than ``max_p95_regression`` above the control's;
- ``advance`` — no breach and the speedup interval's lower bound is above
  ``min_speedup`` (what promoted it in the bench), with at least
  ``min_requests`` requests on each arm;
- ``hold`` — anything else (too few requests, or not shown faster).

The router's automatic rollback acts on breaches only; a canary shown
slower (interval below 1) is reported, and left to a person.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trtspec.runtime.rollout_window import (
    CANARY,
    ArmWindow,
    arm_window,
    breaches,
    succeeded,
)

ADVANCE, HOLD, ROLLBACK = "advance", "hold", "rollback"
CONFIDENCE = 0.95


def _log_costs(records: Iterable[dict[str, Any]]) -> list[float]:
    out = []
    for r in records:
        tokens = r.get("completion_tokens")
        if succeeded(r) and tokens and float(r["latency_ms"]) > 0:
            out.append(math.log(float(r["latency_ms"]) / int(tokens)))
    return out


def speedup_interval(
    canary: Sequence[dict[str, Any]],
    control: Sequence[dict[str, Any]],
    confidence: float = CONFIDENCE,
) -> Any:
    """Control cost / canary cost (ms per output token, geometric means),
    with a Welch t interval; a ``SpeedupEstimate`` (``pairs`` = the smaller
    arm's size) or None with fewer than two usable requests on an arm."""
    from trtspec.bench.sequential import t_quantile
    from trtspec.bench.stats import SpeedupEstimate

    a, b = _log_costs(control), _log_costs(canary)
    if len(a) < 2 or len(b) < 2:
        return None
    ma, mb = sum(a) / len(a), sum(b) / len(b)
    va = sum((x - ma) ** 2 for x in a) / (len(a) - 1)
    vb = sum((x - mb) ** 2 for x in b) / (len(b) - 1)
    diff = ma - mb
    se2 = va / len(a) + vb / len(b)
    if se2 <= 0:
        return SpeedupEstimate(
            math.exp(diff), math.exp(diff), math.exp(diff), min(len(a), len(b)), confidence
        )
    df = se2**2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1))
    half = t_quantile(1 - (1 - confidence) / 2, max(1, int(df))) * math.sqrt(se2)
    return SpeedupEstimate(
        math.exp(diff),
        math.exp(diff - half),
        math.exp(diff + half),
        min(len(a), len(b)),
        confidence,
    )


@dataclass(frozen=True)
class Comparison:
    route: str
    canary: ArmWindow
    control: ArmWindow
    speedup: dict[str, float] | None
    p95_regression: float | None
    verdict: str
    breach: bool
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def split(
    records: Iterable[dict[str, Any]], route: str, size: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The last ``size`` records of ``route`` on each arm (records in time order)."""
    canary: list[dict[str, Any]] = []
    control: list[dict[str, Any]] = []
    for r in records:
        if r.get("route") == route:
            (canary if r.get("arm") == CANARY else control).append(r)
    return canary[-size:], control[-size:]


def compare(
    route: str,
    canary: Sequence[dict[str, Any]],
    control: Sequence[dict[str, Any]],
    thresholds: dict[str, float],
    min_requests: int,
) -> Comparison:
    """Judge one route's window (see the module docstring)."""
    from trtspec.bench.sequential import SLOWER, verdict

    can, con = arm_window(canary), arm_window(control)
    est = speedup_interval(canary, control)
    reasons, regression = breaches(can, con, thresholds, min_requests)
    speedup = None
    if est is not None:
        speedup = {
            "point": est.point,
            "ci_low": est.ci_low,
            "ci_high": est.ci_high,
            "confidence": est.confidence,
        }
    if reasons:
        return Comparison(route, can, con, speedup, regression, ROLLBACK, True, reasons)
    if can.requests < min_requests or con.requests < min_requests:
        reasons.append(
            f"window too small: {can.requests} canary / {con.requests} control requests "
            f"(need {min_requests} each)"
        )
        return Comparison(route, can, con, speedup, regression, HOLD, False, reasons)
    min_speedup = thresholds["min_speedup"]
    if est is None:
        reasons.append("no successful requests to compare")
        return Comparison(route, can, con, speedup, regression, HOLD, False, reasons)
    ci = f"{est.point:.2f}x [{est.ci_low:.2f}, {est.ci_high:.2f}]"
    if est.ci_low > min_speedup:
        return Comparison(route, can, con, speedup, regression, ADVANCE, False, [f"speedup {ci}"])
    if verdict(est, min_speedup) == SLOWER:
        reasons.append(f"canary slower than control: speedup {ci} (consider rollback)")
    else:
        reasons.append(f"speedup {ci} not above {min_speedup:.2f}")
    return Comparison(route, can, con, speedup, regression, HOLD, False, reasons)
