"""A live window's numbers per arm (canary, control) and the breaches that
send a route back to its fallback: the canary's error rate above the bench's
``max_error_rate`` (and above the control's), or its p95 latency more than
``max_p95_regression`` above the control's, with at least ``min_requests``
requests on the arms. Records are request-log lines
(``runtime.models.rollout_log.FIELDS``). Stdlib-only: the router checks its
window with it inside the Python backend stub; ``trtspec.rollout.compare``
adds the speedup interval and the advance verdict for the CLI.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CANARY, CONTROL = "canary", "control"


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class ArmWindow:
    requests: int
    errors: int
    error_rate: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    tokens_per_second: float | None  # median over requests
    acceptance: float | None  # accepted / drafted tokens, where reported


def succeeded(r: dict[str, Any]) -> bool:
    return r.get("error") is None and r.get("latency_ms") is not None


def arm_window(records: Sequence[dict[str, Any]]) -> ArmWindow:
    ok = [r for r in records if succeeded(r)]
    errors = len(records) - len(ok)
    ttft = [float(r["ttft_ms"]) for r in ok if r.get("ttft_ms") is not None]
    latency = [float(r["latency_ms"]) for r in ok]
    tps = [float(r["tokens_per_second"]) for r in ok if r.get("tokens_per_second") is not None]
    drafted = [r for r in ok if r.get("draft_tokens") is not None]
    total_draft = sum(int(r["draft_tokens"]) for r in drafted)
    total_accept = sum(int(r.get("accepted_tokens") or 0) for r in drafted)
    return ArmWindow(
        requests=len(records),
        errors=errors,
        error_rate=errors / len(records) if records else None,
        ttft_p50_ms=percentile(ttft, 50),
        ttft_p95_ms=percentile(ttft, 95),
        latency_p50_ms=percentile(latency, 50),
        latency_p95_ms=percentile(latency, 95),
        tokens_per_second=percentile(tps, 50),
        acceptance=total_accept / total_draft if total_draft else None,
    )


def breaches(
    can: ArmWindow, con: ArmWindow, thresholds: dict[str, float], min_requests: int
) -> tuple[list[str], float | None]:
    """The breaches that send a route back (error rate, p95 latency) and the
    p95 latency regression; cheap enough for the router to look often."""
    reasons: list[str] = []
    max_err = thresholds["max_error_rate"]
    if (
        can.requests >= min_requests
        and can.error_rate is not None
        and can.error_rate > max_err
        and can.error_rate > (con.error_rate or 0.0)
    ):
        reasons.append(f"canary error rate {can.error_rate:.1%} > {max_err:.1%}")
    regression = None
    if can.latency_p95_ms is not None and con.latency_p95_ms:
        regression = can.latency_p95_ms / con.latency_p95_ms - 1.0
        limit = thresholds["max_p95_regression"]
        ok_n = (
            can.requests - can.errors >= min_requests and con.requests - con.errors >= min_requests
        )
        if ok_n and regression > limit:
            reasons.append(f"canary p95 latency +{regression:.0%} > +{limit:.0%}")
    return reasons, regression
