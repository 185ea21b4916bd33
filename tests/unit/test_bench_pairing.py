"""What the summary pairs and what it compares with: rows matched by prompt
sample (never by their position in ``requests.jsonl``) with the samples
only one arm answered reported, and the quality gate judged against the
baseline arm's own rows, not a pass rate set by hand."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from tests.unit.test_bench_summary import cells_by, row

from trtspec.bench.summary import build_summary, pair_by_sample, summarize_rows

# per-sample baseline latencies far apart, so a row paired with the wrong
# sample moves the speedup a long way from the per-prompt truth
BASE = [40.0, 400.0, 90.0, 250.0, 60.0, 700.0, 120.0, 30.0, 520.0, 180.0]
RATIO = [1.5, 1.2, 2.0, 1.1, 1.8, 1.3, 1.6, 1.4, 1.25, 1.7]  # baseline/variant per sample
MISSING = 6  # the sample the baseline lost


def _shuffled_rows() -> list[dict[str, Any]]:
    """The baseline in sample order with one sample missing; the variant's
    rows shuffled (as a cell sampled until decided, or a resumed run, writes
    them), with one sample of its own the baseline never answered."""
    base = [row("r", "baseline", i, lat) for i, lat in enumerate(BASE) if i != MISSING]
    var = [row("r", "v", i, lat / RATIO[i], k=3) for i, lat in enumerate(BASE)]
    var.append(row("r", "v", 10, 55.0, k=3))
    random.Random(7).shuffle(var)
    assert [r["sample_index"] for r in var] != sorted(r["sample_index"] for r in var)
    return [*base, *var]


def test_rows_are_paired_by_sample_whatever_their_order() -> None:
    cell = cells_by(summarize_rows(_shuffled_rows()))[("r", "v", 3)]
    paired = [i for i in range(len(BASE)) if i != MISSING]
    truth = math.exp(sum(math.log(RATIO[i]) for i in paired) / len(paired))
    assert cell["speedup"]["point"] == pytest.approx(truth)
    assert cell["pairs"] == cell["speedup"]["pairs"] == len(paired)
    # the samples left out of every paired figure, by arm
    assert cell["unpaired"] == 2
    assert cell["unpaired_samples"] == {"baseline_only": [], "variant_only": [MISSING, 10]}
    # equality and cache state are per pair too: every pair is equal
    assert cell["equal_rate"] == 1.0
    base = cells_by(summarize_rows(_shuffled_rows()))[("r", "baseline", None)]
    assert base["unpaired"] is None  # a baseline pairs with nothing


def test_pair_by_sample_reports_each_arms_leftovers() -> None:
    base = [row("r", "baseline", i, 100.0) for i in (0, 1, 2, 5)]
    var = [row("r", "v", i, 50.0) for i in (5, 3, 0)]
    pairs, baseline_only, variant_only = pair_by_sample(base, var)
    assert [(b["sample_index"], v["sample_index"]) for b, v in pairs] == [(5, 5), (0, 0)]
    assert (baseline_only, variant_only) == ([1, 2], [3])


def test_the_decision_rests_on_the_paired_samples_only() -> None:
    """A variant row whose baseline row is missing cannot lend its speed to
    another sample: the routed evidence counts the true pairs."""
    summary = build_summary(_shuffled_rows(), {})
    (dec,) = summary["decisions"]
    assert dec["headline"]["pairs"] == len(BASE) - 1
    paired = [i for i in range(len(BASE)) if i != MISSING]
    truth = math.exp(sum(math.log(RATIO[i]) for i in paired) / len(paired))
    assert dec["headline"]["speedup"]["point"] == pytest.approx(truth)


# ---- the quality gate, against a real baseline arm


def _quality_rows(base_pass: list[bool], var_pass: list[bool], temp: float = 0.0) -> list[dict]:
    def q(ok: bool) -> dict[str, Any]:
        return {"json_schema": {"status": "pass" if ok else "fail"}}

    rows = []
    for i, (bp, vp) in enumerate(zip(base_pass, var_pass, strict=True)):
        rows.append(row("json", "baseline", i, 100.0, quality=q(bp), temp=temp))
        rows.append(row("json", "v", i, 50.0, k=2, quality=q(vp), temp=temp))
    return rows


def test_quality_below_the_baseline_arms_own_rate_excludes() -> None:
    n = 20
    summary = build_summary(_quality_rows([True] * n, [i % 4 != 0 for i in range(n)]), {})
    cell = cells_by(summary["cells"])[("json", "v", 2)]
    # the baseline's rate comes from the baseline's rows, not the variant's
    assert (cell["quality_pass_rate"], cell["baseline_quality_pass_rate"]) == (0.75, 1.0)
    (dec,) = summary["decisions"]
    assert dec["decision"] == "exclude"
    assert dec["reasons"] == ["concurrency=1 T=0: quality pass 75% < 95% and below baseline 100%"]
    assert dec["headline"]["baseline_quality_pass_rate"] == 1.0


def test_quality_as_low_as_the_baseline_arms_does_not_exclude() -> None:
    n = 20
    fails = [i % 4 != 0 for i in range(n)]
    summary = build_summary(_quality_rows(fails, fails), {})
    cell = cells_by(summary["cells"])[("json", "v", 2)]
    assert (cell["quality_pass_rate"], cell["baseline_quality_pass_rate"]) == (0.75, 0.75)
    (dec,) = summary["decisions"]
    assert dec["decision"] == "promote", dec["reasons"]


def test_quality_at_temperature_is_a_paired_difference_with_the_baseline_arm() -> None:
    n = 40
    base = [True] * n
    # sampled outputs: the variant fails a quarter of its prompts that the baseline passes
    summary = build_summary(_quality_rows(base, [i % 4 != 0 for i in range(n)], temp=0.7), {})
    cell = cells_by(summary["cells"])[("json", "v", 2)]
    assert cell["baseline_quality_pass_rate"] == 1.0
    assert cell["quality_difference"]["ci_high"] < 0.0
    (dec,) = summary["decisions"]
    assert dec["decision"] == "exclude"
    assert dec["reasons"][0] == (
        "concurrency=1 T=0.7: quality pass 75% < 95% and below baseline 100%"
    )
