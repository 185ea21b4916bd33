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


@dataclass(frozen=True)
class Moments:
    """Count, mean and sample variance of an arm's log cost (ln of ms per
    output token; any fixed unit gives the same interval)."""

    n: int
    mean: float
    var: float

    @classmethod
    def of(cls, xs: Sequence[float]) -> Moments:
        n = len(xs)
        mean = sum(xs) / n if n else 0.0
        var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
        return cls(n, mean, var)

    @classmethod
    def from_sums(cls, n: float, total: float, squares: float) -> Moments:
        """From a count, a sum and a sum of squares (the router's series)."""
        count = round(n)
        if count < 1:
            return cls(0, 0.0, 0.0)
        mean = total / n
        var = max(0.0, (squares - total * total / n) / (n - 1)) if count > 1 else 0.0
        return cls(count, mean, var)


def speedup_interval(
    canary: Sequence[dict[str, Any]],
    control: Sequence[dict[str, Any]],
    confidence: float = CONFIDENCE,
) -> Any:
    """Control cost / canary cost (ms per output token, geometric means),
    with a Welch t interval; a ``SpeedupEstimate`` (``pairs`` = the smaller
    arm's size) or None with fewer than two usable requests on an arm."""
    return welch(Moments.of(_log_costs(canary)), Moments.of(_log_costs(control)), confidence)


def welch(canary: Moments, control: Moments, confidence: float = CONFIDENCE) -> Any:
    """``speedup_interval`` from each arm's ``Moments``."""
    from trtspec.bench.sequential import t_quantile
    from trtspec.bench.stats import SpeedupEstimate

    a, b = control, canary
    if a.n < 2 or b.n < 2:
        return None
    diff = a.mean - b.mean
    se2 = a.var / a.n + b.var / b.n
    pairs = min(a.n, b.n)
    if se2 <= 0:
        return SpeedupEstimate(math.exp(diff), math.exp(diff), math.exp(diff), pairs, confidence)
    df = se2**2 / ((a.var / a.n) ** 2 / (a.n - 1) + (b.var / b.n) ** 2 / (b.n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, max(1, int(df))) * math.sqrt(se2)
    return SpeedupEstimate(
        math.exp(diff), math.exp(diff - half), math.exp(diff + half), pairs, confidence
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
        # a golden-check line (a pod's streams collected together) is no request
        if r.get("route") == route and "golden_prompt" not in r:
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
    return judge(
        route,
        arm_window(canary),
        con=arm_window(control),
        est=speedup_interval(canary, control),
        thresholds=thresholds,
        min_requests=min_requests,
    )


def judge(
    route: str,
    can: ArmWindow,
    *,
    con: ArmWindow,
    est: Any,
    thresholds: dict[str, float],
    min_requests: int,
) -> Comparison:
    """The verdict on two arms' windows and the speedup estimate, however
    they were measured (request-log records, or the router's series in
    Prometheus: ``rollout.prometheus``)."""
    from trtspec.bench.sequential import SLOWER, verdict

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
