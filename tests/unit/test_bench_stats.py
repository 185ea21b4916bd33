"""Percentiles, distributions and the paired bootstrap speedup on known data."""

from __future__ import annotations

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


def test_rate() -> None:
    assert stats.rate(1, 4) == 0.25
    assert stats.rate(0, 0) is None
