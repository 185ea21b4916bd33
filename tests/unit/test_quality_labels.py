"""Every quality label of the console line (report.quality_label), each
from the decision it describes; the "as baseline" one only when the variant
is no better than the baseline."""

from __future__ import annotations

from typing import Any

import pytest

from trtspec.bench.report_console import quality_label
from trtspec.bench.summary import DEFAULT_DECISION


def dec(q: float | None, base: float | None = None, eq: float | None = 1.0, reasons=()) -> dict:
    headline: dict[str, Any] = {
        "quality_pass_rate": q,
        "baseline_quality_pass_rate": base,
        "equal_rate": eq,
    }
    return {"headline": headline, "reasons": list(reasons)}


@pytest.mark.parametrize(
    ("decision", "label"),
    [
        (dec(1.0, 1.0, eq=0.5), "quality differs"),
        (
            dec(0.2, 0.9, reasons=["concurrency=1 T=0: quality pass 20% < 80% and below baseline"]),
            "quality fail",
        ),
        (dec(None), "quality n/a"),
        (dec(0.95, 0.9), "quality pass"),
        (dec(0.5, 0.5), "quality 50% as baseline"),
        (dec(0.6, 0.4), "quality 60%, above baseline 40%"),
        (dec(0.5, None), "quality 50% as baseline"),
    ],
)
def test_each_quality_label(decision: dict, label: str) -> None:
    assert quality_label(decision, DEFAULT_DECISION) == label


def test_the_bar_is_the_decision_setting() -> None:
    strict = {**DEFAULT_DECISION, "min_quality_pass_rate": 0.99}
    assert quality_label(dec(0.95, 0.95), strict) == "quality 95% as baseline"
    assert quality_label(dec(0.95, 0.95), DEFAULT_DECISION) == "quality pass"
