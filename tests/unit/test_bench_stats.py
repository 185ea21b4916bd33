"""Percentiles, distributions and the paired bootstrap speedup on known data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trtspec.bench import stats


def test_percentile_known_values() -> None:
    data = [15, 20, 35, 40, 50]
    assert stats.percentile(data, 0) == 15
    assert stats.percentile(data, 50) == 35
    assert stats.percentile(data, 100) == 50
    # linear interpolation: position (5-1)*0.4 = 1.6 -> 20 + 0.6*15
    assert stats.percentile(data, 40) == pytest.approx(29.0)
    assert stats.percentile(data, 95) == pytest.approx(48.0)


def test_percentile_matches_numpy_default_and_ignores_order() -> None:
    rng = np.random.default_rng(0)
    data = rng.exponential(10.0, size=101).tolist()
    shuffled = list(reversed(data))
    for q in (1, 5, 25, 50, 75, 95, 99):
        assert stats.percentile(shuffled, q) == pytest.approx(float(np.percentile(data, q)))


def test_percentile_edge_cases() -> None:
    assert stats.percentile([], 50) is None
    assert stats.percentile([7.5], 95) == 7.5
    with pytest.raises(ValueError, match=r"percentile q must be in \[0, 100\], got 101"):
        stats.percentile([1, 2], 101)


def test_distribution_skips_nulls() -> None:
    d = stats.distribution([1.0, None, 3.0, 2.0])
    assert d == {
        "p50": 2.0,
        "p95": pytest.approx(2.9),
        "p99": pytest.approx(2.98),
        "mean": 2.0,
        "min": 1.0,
        "max": 3.0,
    }
    assert stats.distribution([None])["p50"] is None


def test_paired_speedup_constant_ratio_has_degenerate_interval() -> None:
    base = [10.0, 20.0, 40.0, 5.0]
    var = [5.0, 10.0, 20.0, 2.5]
    est = stats.paired_speedup(base, var)
    assert est is not None
    assert est.point == pytest.approx(2.0)
    assert est.ci_low == pytest.approx(2.0)
    assert est.ci_high == pytest.approx(2.0)
    assert est.pairs == 4


def test_paired_speedup_is_geometric_mean_of_ratios() -> None:
    est = stats.paired_speedup([4.0, 1.0], [1.0, 1.0])
    assert est is not None
    assert est.point == pytest.approx(2.0)  # sqrt(4 * 1)


def test_paired_speedup_ci_is_reproducible_and_brackets_the_point() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(8, 12, size=40).tolist()
    var = [b / rng.uniform(1.1, 1.5) for b in base]
    a = stats.paired_speedup(base, var, seed=7)
    b = stats.paired_speedup(base, var, seed=7)
    assert a == b
    assert a is not None
    assert a.ci_low < a.point < a.ci_high
    assert a.ci_low > 1.1
    assert a.ci_high < 1.5


def test_paired_speedup_pairs_not_arms() -> None:
    # huge prompt-to-prompt spread but a constant 1.25x per pair: a paired CI
    # stays tight, which an unpaired comparison of the two arms would not
    base = [1.0, 100.0, 10.0, 1000.0, 3.0, 30.0]
    var = [b / 1.25 for b in base]
    est = stats.paired_speedup(base, var)
    assert est is not None
    assert est.ci_high - est.ci_low == pytest.approx(0.0, abs=1e-9)


def test_paired_speedup_known_bootstrap_values() -> None:
    est = stats.paired_speedup([2.0, 3.0, 4.0, 6.0], [1.0, 3.0, 2.0, 3.0], samples=500, seed=3)
    assert est is not None
    logs = [math.log(2), 0.0, math.log(2), math.log(2)]
    assert est.point == pytest.approx(math.exp(sum(logs) / 4))
    assert est.ci_low >= 1.0 - 1e-12
    assert est.ci_high <= 2.0 + 1e-12


def test_paired_speedup_unusable_input() -> None:
    assert stats.paired_speedup([], []) is None
    assert stats.paired_speedup([0.0, 1.0], [1.0, 0.0]) is None
    with pytest.raises(ValueError, match="same length"):
        stats.paired_speedup([1.0], [1.0, 2.0])


def test_rate() -> None:
    assert stats.rate(1, 4) == 0.25
    assert stats.rate(0, 0) is None
