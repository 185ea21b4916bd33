"""Every threshold a decision uses, on its boundary and straddled: the
speedup interval against ``min_speedup`` and against 1, the p95 regression,
the quality pass rate (and its paired difference at T > 0), the T=0
equality rate, the error rate (own errors and infrastructure incidents),
and the goodput difference. A point estimate on the right side of a
threshold whose interval reaches across it is never a promote."""

from __future__ import annotations

from typing import Any

import pytest

from trtspec.bench.decide import decide, judge_cell
from trtspec.spec.schema import DEFAULT_DECISION

W0 = "concurrency=1 T=0"
W7 = "concurrency=1 T=0.7"


def _cell(**changes: Any) -> dict[str, Any]:
    """A cell that promotes under the default thresholds, with ``changes``."""
    cell: dict[str, Any] = {
        "route": "r",
        "variant": "v",
        "num_speculative_tokens": 2,
        "pairs_with": "baseline",
        "arm_kind": "triton",
        "load": "concurrency=1",
        "concurrency": 1,
        "temperature": 0.0,
        "count": 100,
        "errors": 0,
        "incidents": 0,
        "error_rate": 0.0,
        "quality_pass_rate": 1.0,
        "baseline_quality_pass_rate": 1.0,
        "quality_difference": None,
        "equal_rate": 1.0,
        "distribution_test": None,
        "speedup": {"point": 1.5, "ci_low": 1.3, "ci_high": 1.7},
        "pairs": 100,
        "p95_latency_regression": 0.0,
        "goodput_difference": None,
    }
    cell.update(changes)
    return cell


def _sp(point: float, low: float, high: float) -> dict[str, float]:
    return {"point": point, "ci_low": low, "ci_high": high}


CASES: list[tuple[str, dict[str, Any], dict[str, Any], str, list[str]]] = [
    # -- speedup against min_speedup (1.05): the interval's low end decides
    ("promotes", {}, {}, "promote", [f"{W0}: speedup 1.50x [1.30, 1.70]"]),
    (
        "point above, interval straddling min_speedup",
        {"speedup": _sp(1.20, 1.01, 1.40)},
        {},
        "inconclusive",
        [f"{W0}: speedup 1.20x [1.01, 1.40] not above 1.05"],
    ),
    (
        "interval's low end on min_speedup",
        {"speedup": _sp(1.20, 1.05, 1.40)},
        {},
        "inconclusive",
        [f"{W0}: speedup 1.20x [1.05, 1.40] not above 1.05"],
    ),
    (
        "interval's low end just above min_speedup",
        {"speedup": _sp(1.20, 1.0501, 1.40)},
        {},
        "promote",
        [f"{W0}: speedup 1.20x [1.05, 1.40]"],
    ),
    (
        "a stricter min_speedup moves the line",
        {"speedup": _sp(1.50, 1.30, 1.70)},
        {"min_speedup": 1.30},
        "inconclusive",
        [f"{W0}: speedup 1.50x [1.30, 1.70] not above 1.30"],
    ),
    # -- speedup against 1: only an interval wholly below 1 is slower
    (
        "point below 1, interval straddling 1",
        {"speedup": _sp(0.95, 0.85, 1.08)},
        {},
        "inconclusive",
        [f"{W0}: speedup 0.95x [0.85, 1.08] not above 1.05"],
    ),
    (
        "interval's high end on 1",
        {"speedup": _sp(0.95, 0.90, 1.0)},
        {},
        "inconclusive",
        [f"{W0}: speedup 0.95x [0.90, 1.00] not above 1.05"],
    ),
    (
        "interval wholly below 1",
        {"speedup": _sp(0.95, 0.90, 0.999)},
        {},
        "exclude",
        [f"{W0}: slower than baseline, speedup 0.95x [0.90, 1.00]"],
    ),
    # -- p95 latency regression (max 10%): at the bound is allowed
    ("p95 on its bound", {"p95_latency_regression": 0.10}, {}, "promote", None),
    (
        "p95 just over its bound",
        {"p95_latency_regression": 0.1001},
        {},
        "inconclusive",
        [f"{W0}: p95 latency +10% > +10%"],
    ),
    (
        "p95 over with the speedup straddling too",
        {"p95_latency_regression": 0.25, "speedup": _sp(1.20, 1.01, 1.40)},
        {},
        "inconclusive",
        [
            f"{W0}: p95 latency +25% > +10%",
            f"{W0}: speedup 1.20x [1.01, 1.40] not above 1.05",
        ],
    ),
    # -- quality pass rate (min 95%), judged against the baseline's own rate
    ("quality on its bound", {"quality_pass_rate": 0.95}, {}, "promote", None),
    (
        "quality just under its bound and under the baseline",
        {"quality_pass_rate": 0.94},
        {},
        "exclude",
        [f"{W0}: quality pass 94% < 95% and below baseline 100%"],
    ),
    (
        "quality under its bound, equal to the baseline's",
        {"quality_pass_rate": 0.94, "baseline_quality_pass_rate": 0.94},
        {},
        "promote",
        None,
    ),
    (
        "quality under its bound, no baseline rate",
        {"quality_pass_rate": 0.94, "baseline_quality_pass_rate": None},
        {},
        "exclude",
        [f"{W0}: quality pass 94% < 95%"],
    ),
    # -- at T > 0 the paired quality difference must lie below 0 to break
    (
        "T>0: quality difference straddling 0",
        {
            "temperature": 0.7,
            "equal_rate": None,
            "quality_pass_rate": 0.90,
            "quality_difference": {"point": -0.05, "ci_low": -0.15, "ci_high": 0.04},
        },
        {},
        "inconclusive",
        [
            f"{W7}: quality 90% vs baseline 100%, paired difference -5% [-15%, +4%] "
            "not shown below 0 at this temperature"
        ],
    ),
    (
        "T>0: quality difference's high end on 0",
        {
            "temperature": 0.7,
            "equal_rate": None,
            "quality_pass_rate": 0.90,
            "quality_difference": {"point": -0.05, "ci_low": -0.10, "ci_high": 0.0},
        },
        {},
        "inconclusive",
        [
            f"{W7}: quality 90% vs baseline 100%, paired difference -5% [-10%, +0%] "
            "not shown below 0 at this temperature"
        ],
    ),
    (
        "T>0: quality difference wholly below 0",
        {
            "temperature": 0.7,
            "equal_rate": None,
            "quality_pass_rate": 0.90,
            "quality_difference": {"point": -0.1, "ci_low": -0.18, "ci_high": -0.02},
        },
        {},
        "exclude",
        [f"{W7}: quality pass 90% < 95% and below baseline 100%"],
    ),
    # -- T=0 equality with the baseline (default: every prompt)
    (
        "equality just under 100%",
        {"equal_rate": 0.99},
        {},
        "exclude",
        [f"{W0}: output equals baseline in 99% of prompts at T=0 (need 100%)"],
    ),
    ("equality on a lower bound", {"equal_rate": 0.9}, {"min_equal_rate": 0.9}, "promote", None),
    (
        "equality just under a lower bound",
        {"equal_rate": 0.89},
        {"min_equal_rate": 0.9},
        "exclude",
        [f"{W0}: output equals baseline in 89% of prompts at T=0 (need 90%)"],
    ),
    (
        "no successful pairs to compare at T=0",
        {"equal_rate": None},
        {},
        "inconclusive",
        [f"{W0}: no successful pairs to compare outputs"],
    ),
    (
        "inequality excludes even with the speedup straddling",
        {"equal_rate": 0.5, "speedup": _sp(1.20, 1.01, 1.40)},
        {},
        "exclude",
        [f"{W0}: output equals baseline in 50% of prompts at T=0 (need 100%)"],
    ),
    # -- error rate (max 1%): at the bound is allowed
    ("errors on their bound", {"errors": 1, "error_rate": 0.01}, {}, "promote", None),
    (
        "errors just over their bound",
        {"count": 1000, "errors": 11, "error_rate": 0.011},
        {},
        "exclude",
        [f"{W0}: error rate 1.1% > 1.0%"],
    ),
    (
        "errors over the bound, all caused by incidents",
        {"errors": 3, "incidents": 3, "error_rate": 0.03},
        {},
        "inconclusive",
        [
            f"{W0}: 3 request(s) failed by a stub crash or server restart, counted as errors "
            "(error rate 3.0%) > 1.0%: not judged on infrastructure failures"
        ],
    ),
    (
        "errors over the bound, the variant's own beyond the incidents",
        {"errors": 3, "incidents": 1, "error_rate": 0.03},
        {},
        "exclude",
        [f"{W0}: error rate 3.0% > 1.0%"],
    ),
]


@pytest.mark.parametrize(
    ("changes", "thresholds", "verdict", "reasons"),
    [pytest.param(c, t, v, r, id=name) for name, c, t, v, r in CASES],
)
def test_each_threshold_on_its_boundary_and_straddled(
    changes: dict[str, Any], thresholds: dict[str, Any], verdict: str, reasons: list[str] | None
) -> None:
    got = judge_cell(_cell(**changes), {**DEFAULT_DECISION, **thresholds})
    assert got[0] == verdict, got
    if reasons is not None:
        assert got[1] == reasons


SHARE = f"{W0}: share meeting the objectives"
GOODPUT: list[tuple[str, dict[str, float], str, str]] = [
    (
        "above 0",
        {"point": 0.2, "ci_low": 0.05, "ci_high": 0.35},
        "promote",
        f"{SHARE} +20% [+5%, +35%] vs baseline",
    ),
    (
        "straddling 0",
        {"point": 0.1, "ci_low": -0.05, "ci_high": 0.25},
        "inconclusive",
        f"{SHARE} +10% [-5%, +25%] vs baseline, not above 0",
    ),
    (
        "low end on 0",
        {"point": 0.1, "ci_low": 0.0, "ci_high": 0.2},
        "inconclusive",
        f"{SHARE} +10% [+0%, +20%] vs baseline, not above 0",
    ),
    (
        "high end on 0",
        {"point": -0.1, "ci_low": -0.2, "ci_high": 0.0},
        "inconclusive",
        f"{SHARE} -10% [-20%, +0%] vs baseline, not above 0",
    ),
    (
        "wholly below 0",
        {"point": -0.1, "ci_low": -0.2, "ci_high": -0.01},
        "exclude",
        f"{W0}: fewer requests meet the objectives, share meeting the objectives "
        "-10% [-20%, -1%] vs baseline",
    ),
]


@pytest.mark.parametrize(
    ("difference", "verdict", "reason"),
    [pytest.param(g, v, r, id=name) for name, g, v, r in GOODPUT],
)
def test_goodput_difference_on_and_across_zero(
    difference: dict[str, float], verdict: str, reason: str
) -> None:
    """Deciding by goodput: the paired share difference's interval against 0."""
    d = {**DEFAULT_DECISION, "decide_by": "goodput"}
    # the speedup straddles min_speedup: deciding by goodput, it plays no part
    cell = _cell(speedup=_sp(1.20, 1.01, 1.40), goodput_difference={**difference, "pairs": 100})
    assert judge_cell(cell, d) == (verdict, [reason])


def test_a_straddling_variant_is_not_routed() -> None:
    """Point 1.20, interval [1.01, 1.40], min_speedup 1.05: inconclusive end
    to end, so routing.yaml keeps the route on its baseline."""
    baseline = _cell(variant="baseline", num_speculative_tokens=None, pairs_with=None)
    for key in ("speedup", "equal_rate", "p95_latency_regression", "baseline_quality_pass_rate"):
        baseline[key] = None
    straddling = _cell(speedup=_sp(1.20, 1.01, 1.40))
    decisions, routing = decide([baseline, straddling], dict(DEFAULT_DECISION))
    (dec,) = decisions
    assert dec["decision"] == "inconclusive"
    assert dec["reasons"] == [f"{W0}: speedup 1.20x [1.01, 1.40] not above 1.05"]
    assert routing["routes"] == {"r": {"variant": "baseline", "decision": "inconclusive"}}
    # the same numbers one notch clear of the line promote and route
    clear = _cell(speedup=_sp(1.20, 1.06, 1.40))
    _, routing = decide([baseline, clear], dict(DEFAULT_DECISION))
    assert routing["routes"]["r"]["variant"] == "v"
    assert routing["routes"]["r"]["decision"] == "promote"


def test_a_straddling_level_caps_the_promote_below_it() -> None:
    """Promoted alone, straddling min_speedup at 4 in flight: promoted up to
    concurrency 1 only, and routing.yaml says so."""
    baseline = {
        **_cell(variant="baseline", num_speculative_tokens=None, pairs_with=None),
        "speedup": None,
    }
    four = {"load": "concurrency=4", "concurrency": 4}
    cells = [
        baseline,
        {**baseline, **four},
        _cell(),
        _cell(**four, speedup=_sp(1.20, 1.01, 1.40)),
    ]
    (dec,), routing = decide(cells, dict(DEFAULT_DECISION))
    assert (dec["decision"], dec["max_concurrency"]) == ("promote", 1)
    assert [lvl["decision"] for lvl in dec["levels"]] == ["promote", "inconclusive"]
    assert dec["reasons"][-2:] == [
        "concurrency=4 T=0: speedup 1.20x [1.01, 1.40] not above 1.05",
        "promoted up to concurrency 1 only: inconclusive at concurrency=4 "
        "(max_concurrency 1 in routing.yaml)",
    ]
    assert routing["routes"]["r"]["max_concurrency"] == 1
