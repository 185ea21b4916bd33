"""Sampling until a cell is decided, with an error rate that survives the
repeated looks (docs/design/decisions.md).

A cell (route × variant × k × load × temperature) is looked at after its
first ``first`` pairs and then after every ``batch`` more, up to ``maximum``
pairs: at most ``looks`` looks. At each look the speedup interval is the
Student-t interval on the mean per-prompt log ratio log(baseline cost /
variant cost), at confidence ``1 − alpha/looks`` (a Bonferroni split of
``alpha`` over the looks, i.e. alpha spending with a flat spending function).
The cell stops when that interval clears ``min_speedup`` (faster) or lies
below 1.0 (slower), or at ``maximum``. Because every look spends at most
``alpha/looks`` per side pair, the chance of *any* false stop over all looks is
at most ``alpha`` whatever the correlation between looks (the union bound);
``tests/unit/test_bench_sequential.py`` checks it by simulation. The t interval
rather than a bootstrap: at 5–10 pairs, where a sequential run looks most, a
percentile bootstrap covers far less than its nominal level, while the t
interval is exact for normal log ratios and close for the skewed ones seen in
latency data. A fixed ``--requests N`` run is one look (``looks == 1``): the
plain 95% t interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from trtspec.bench.stats import SpeedupEstimate

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_PAIRS = 5
DEFAULT_MAX_REQUESTS = 30
DEFAULT_BATCH = 5

FASTER, SLOWER, UNDECIDED = "faster", "slower", "undecided"


@lru_cache(maxsize=512)
def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``df`` degrees of
    freedom: bisection on the CDF, integrated numerically (numpy only; no
    scipy in the dependencies)."""
    import numpy as np

    if not 0.5 < p < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(x: float) -> float:
        # substitution t = x*u keeps the grid dense near 0 for any x
        u = np.linspace(0.0, 1.0, 4001)
        dens = np.exp(log_norm - (df + 1) / 2 * np.log1p((x * u) ** 2 / df))
        return 0.5 + float(x * np.sum((dens[1:] + dens[:-1]) / 2) / (len(u) - 1))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def paired_ratio_interval(
    baseline: Sequence[float | None],
    variant: Sequence[float | None],
    confidence: float = 1 - DEFAULT_ALPHA,
) -> SpeedupEstimate | None:
    """Speedup = exp(mean log(baseline[i]/variant[i])) over usable pairs, with
    the t interval at ``confidence``; ``None`` without a usable pair. One pair
    gives a point with no width (nothing to estimate a spread from)."""
    if len(baseline) != len(variant):
        raise ValueError("paired_ratio_interval needs two sequences of the same length")
    logs = [
        math.log(b / v)
        for b, v in zip(baseline, variant, strict=True)
        if b is not None and v is not None and b > 0 and v > 0
    ]
    n = len(logs)
    if n == 0:
        return None
    mean = sum(logs) / n
    point = math.exp(mean)
    if n == 1:
        return SpeedupEstimate(point, point, point, 1, confidence)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(1 - (1 - confidence) / 2, n - 1) * sd / math.sqrt(n)
    return SpeedupEstimate(point, math.exp(mean - half), math.exp(mean + half), n, confidence)


@dataclass(frozen=True)
class SequentialPlan:
    """When a cell is looked at and at which confidence."""

    first: int = DEFAULT_MIN_PAIRS
    batch: int = DEFAULT_BATCH
    maximum: int = DEFAULT_MAX_REQUESTS
    alpha: float = DEFAULT_ALPHA

    def __post_init__(self) -> None:
        if self.first < 1 or self.batch < 1 or self.maximum < 1:
            raise ValueError("first, batch and maximum must be >= 1")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("alpha must be in (0, 1)")

    @classmethod
    def fixed(cls, n: int, alpha: float = DEFAULT_ALPHA) -> SequentialPlan:
        """One look after ``n`` pairs: a plain fixed-count run."""
        return cls(first=n, batch=n, maximum=n, alpha=alpha)

    @property
    def sizes(self) -> list[int]:
        """Pair counts at which the cell is looked at."""
        first = min(self.first, self.maximum)
        out = list(range(first, self.maximum, self.batch))
        return [*out, self.maximum] if not out or out[-1] != self.maximum else out

    def sizes_at(self, level: int | None) -> list[int]:
        """Pair counts at which a cell at closed-loop ``level`` is looked at:
        ``sizes`` rounded up to whole blocks of ``level`` and capped at the
        whole blocks ``maximum`` allows (bench/blocks.py), duplicates dropped.
        Never more looks than ``sizes``, so the per-look confidence of
        ``looks`` still bounds the whole cell's error by ``alpha`` (union
        bound)."""
        from trtspec.bench.blocks import round_up, whole_blocks

        cap = whole_blocks(self.maximum, level)
        return sorted({min(round_up(size, level), cap) for size in self.sizes})

    @property
    def looks(self) -> int:
        return len(self.sizes)

    @property
    def confidence(self) -> float:
        """The interval level used at every look."""
        return 1.0 - self.alpha / self.looks

    def capped(self, n: int | None) -> SequentialPlan:
        """This plan stopping at ``n`` pairs (a route's own ``requests``),
        looked at with the same per-look confidence, so the run stops on the
        intervals the summary reports; ``self`` when ``n`` does not cut it."""
        if n is None or n >= self.maximum:
            return self
        cut = replace(self, maximum=max(1, n))
        return replace(cut, alpha=self.alpha * cut.looks / self.looks)

    def as_dict(self) -> dict[str, float | int]:
        return {
            "first": self.first,
            "batch": self.batch,
            "maximum": self.maximum,
            "alpha": self.alpha,
            "looks": self.looks,
            "confidence": self.confidence,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SequentialPlan | None:
        if not data:
            return None
        return cls(
            first=int(data["first"]),
            batch=int(data["batch"]),
            maximum=int(data["maximum"]),
            alpha=float(data["alpha"]),
        )


def verdict(est: SpeedupEstimate | None, min_speedup: float) -> str:
    """What a look concludes from its interval."""
    if est is None or est.pairs < 2:
        return UNDECIDED
    if est.ci_low > min_speedup:
        return FASTER
    if est.ci_high < 1.0:
        return SLOWER
    return UNDECIDED


def next_size(plan: SequentialPlan, done: int, level: int | None = None) -> int | None:
    """The pair count of the next look after ``done`` pairs at ``level``;
    None at the cap."""
    for size in plan.sizes_at(level):
        if size > done:
            return size
    return None


def look(
    plan: SequentialPlan,
    baseline: Sequence[float | None],
    variant: Sequence[float | None],
    min_speedup: float,
) -> tuple[str, SpeedupEstimate | None]:
    """One look at a cell's paired costs so far (in sample order)."""
    est = paired_ratio_interval(baseline, variant, plan.confidence)
    return verdict(est, min_speedup), est


def simulate(
    plan: SequentialPlan, pairs: Sequence[tuple[float, float]], min_speedup: float
) -> tuple[str, int]:
    """Run ``plan`` over a stream of (baseline, variant) costs, looking at
    each of its sizes: (verdict, pairs used). What the runner does, minus the
    server; the unit tests measure its error rate with it."""
    for size in plan.sizes:
        if size > len(pairs):
            break
        got, _ = look(plan, [b for b, _ in pairs[:size]], [v for _, v in pairs[:size]], min_speedup)
        if got != UNDECIDED:
            return got, size
    return UNDECIDED, min(len(pairs), plan.maximum)
