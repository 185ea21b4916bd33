"""Pure statistics for the benchmark: percentiles with linear interpolation
(the same definition as ``numpy.percentile``'s default, so numbers can be
recomputed by anyone from ``requests.jsonl``), distribution summaries, and the
speedup estimate's record (``SpeedupEstimate``; ``bench/sequential.py``
computes it, with a t interval). Nothing here reads files or clocks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

from trtspec.artifacts.bench_run import Distribution, Interval, PairedDifference


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation between
    closest ranks; ``None`` for an empty sample."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    data = sorted(float(v) for v in values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(data) - 1)
    frac = pos - lo
    return data[lo] + (data[hi] - data[lo]) * frac


def distribution(values: Sequence[float | None]) -> Distribution:
    """p50/p95/p99/mean/min/max of the non-null values."""
    data = [float(v) for v in values if v is not None]
    if not data:
        return {"p50": None, "p95": None, "p99": None, "mean": None, "min": None, "max": None}
    return {
        "p50": percentile(data, 50),
        "p95": percentile(data, 95),
        "p99": percentile(data, 99),
        "mean": sum(data) / len(data),
        "min": min(data),
        "max": max(data),
    }


@dataclass(frozen=True)
class SpeedupEstimate:
    """Geometric-mean speedup of paired requests with a percentile-bootstrap
    CI. ``point`` > 1 means the variant is faster than the baseline."""

    point: float
    ci_low: float
    ci_high: float
    pairs: int
    confidence: float

    def as_dict(self) -> Interval:
        return {
            "point": self.point,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "pairs": self.pairs,
            "confidence": self.confidence,
        }


def rate(numerator: int, denominator: int) -> float | None:
    """``numerator / denominator``, or ``None`` when nothing was counted."""
    return numerator / denominator if denominator else None


def paired_proportion_difference(
    outcomes: Sequence[tuple[bool, bool]], confidence: float = 0.95
) -> PairedDifference | None:
    """Variant share − baseline share of a yes/no outcome over paired prompts
    (``(baseline, variant)`` per pair), with the Agresti–Min interval for
    paired proportions: a Wald interval on the 2×2 table with ½ added to each
    discordant cell, honest at small n and when every pair agrees."""
    if not outcomes:
        return None
    both = only_variant = only_baseline = neither = 0
    for b, v in outcomes:
        both += b and v
        only_variant += v and not b
        only_baseline += b and not v
        neither += not b and not v
    n = len(outcomes)
    adj = n + 2.0
    p10, p01 = (only_variant + 0.5) / adj, (only_baseline + 0.5) / adj
    centre = p10 - p01
    half = NormalDist().inv_cdf(1 - (1 - confidence) / 2) * math.sqrt(
        max((p10 + p01) - centre**2, 0.0) / adj
    )
    return {
        "point": (only_variant - only_baseline) / n,
        "ci_low": max(-1.0, centre - half),
        "ci_high": min(1.0, centre + half),
        "pairs": n,
        "confidence": confidence,
        "table": {
            "both": both,
            "only_variant": only_variant,
            "only_baseline": only_baseline,
            "neither": neither,
        },
    }
