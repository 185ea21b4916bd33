"""Pure statistics for the benchmark: percentiles with linear interpolation
(the same definition as ``numpy.percentile``'s default, so numbers can be
recomputed by anyone from ``requests.jsonl``), distribution summaries, and the
paired speedup estimate with its bootstrap confidence interval. Nothing here
reads files or clocks; every random draw comes from an explicit seed so a
re-render of the same rows gives the same interval."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_BOOTSTRAP_SAMPLES = 2000
DEFAULT_BOOTSTRAP_SEED = 20240607


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


def distribution(values: Sequence[float | None]) -> dict[str, float | None]:
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

    def as_dict(self) -> dict[str, float | int]:
        return {
            "point": self.point,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "pairs": self.pairs,
            "confidence": self.confidence,
        }


def paired_speedup(
    baseline: Sequence[float],
    variant: Sequence[float],
    *,
    samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    confidence: float = 0.95,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> SpeedupEstimate | None:
    """Speedup from paired costs (e.g. ms per output token of the same prompt
    on the baseline and on the variant): the geometric mean of
    ``baseline[i] / variant[i]``. The CI resamples *pairs* (not the two arms
    independently), which is what keeps prompt-to-prompt variation out of the
    interval. ``None`` when there is no usable pair."""
    if len(baseline) != len(variant):
        raise ValueError("paired_speedup needs two sequences of the same length")
    logs = [
        math.log(b / v)
        for b, v in zip(baseline, variant, strict=True)
        if b is not None and v is not None and b > 0 and v > 0
    ]
    if not logs:
        return None
    arr = np.asarray(logs, dtype=float)
    point = float(math.exp(arr.mean()))
    if len(arr) == 1:
        return SpeedupEstimate(point, point, point, 1, confidence)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(arr), size=(samples, len(arr)))
    means = arr[idx].mean(axis=1)
    alpha = (1.0 - confidence) / 2.0
    low = float(math.exp(percentile(means.tolist(), 100.0 * alpha) or 0.0))
    high = float(math.exp(percentile(means.tolist(), 100.0 * (1.0 - alpha)) or 0.0))
    return SpeedupEstimate(point, low, high, len(arr), confidence)


def rate(numerator: int, denominator: int) -> float | None:
    """``numerator / denominator``, or ``None`` when nothing was counted."""
    return numerator / denominator if denominator else None
