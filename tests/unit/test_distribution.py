"""Temperature > 0: the first-token homogeneity test (chi-square survival
checked against table values), pooling of rare tokens, and a decision that
excludes a variant sampling from another distribution while a faithful one
passes; decisions record the temperatures they hold for."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from tests.unit.test_bench_summary import row

from trtspec.bench.distribution import chi2_sf, homogeneity, table_rows
from trtspec.bench.summary import build_summary


@pytest.mark.parametrize(
    ("stat", "dof", "p"),
    [(3.841, 1, 0.05), (10.828, 1, 0.001), (18.307, 10, 0.05), (5.991, 2, 0.05), (0.0, 3, 1.0)],
)
def test_chi2_survival_matches_tables(stat: float, dof: int, p: float) -> None:
    assert chi2_sf(stat, dof) == pytest.approx(p, rel=2e-3)


def test_homogeneity_pools_rare_tokens() -> None:
    a = Counter({1: 40, 2: 40, 3: 1, 4: 1})
    b = Counter({1: 41, 2: 39, 5: 2})
    res = homogeneity(a, b)
    assert res is not None
    assert res["dof"] == 2  # tokens 1, 2 and <other> (3, 4, 5 pooled)
    assert res["p_value"] > 0.5
    shifted = homogeneity(Counter({1: 70, 2: 10}), Counter({1: 10, 2: 70}))
    assert shifted is not None and shifted["p_value"] < 1e-12
    assert homogeneity(Counter({1: 5}), Counter({1: 5})) is None  # one category


def _sampled_rows(variant_probs: list[float], n: int = 120) -> list[dict[str, Any]]:
    rng = random.Random(0)
    target = [0.6, 0.3, 0.1]
    rows = []
    for i in range(n):
        b = row("chat", "baseline", i, 100.0, temp=0.7)
        v = row("chat", "ngram", i, 80.0, k=4, temp=0.7)
        b["first_token"] = rng.choices([11, 12, 13], target)[0]
        v["first_token"] = rng.choices([11, 12, 13], variant_probs)[0]
        rows += [b, v]
    return rows


def test_wrong_distribution_is_excluded_at_temperature() -> None:
    summary = build_summary(_sampled_rows([0.1, 0.3, 0.6]), {})
    (dec,) = summary["decisions"]
    assert dec["decision"] == "exclude"
    assert dec["temperatures"] == [0.7]
    (reason,) = [r for r in dec["reasons"] if "first-token" in r]
    assert reason.startswith(
        "concurrency=1 T=0.7: first-token distribution differs from the baseline's (chi-square "
    )
    cell = next(c for c in summary["cells"] if c["variant"] == "ngram")
    assert cell["distribution_test"]["samples"] == [120, 120]


def test_faithful_variant_passes_the_test() -> None:
    summary = build_summary(_sampled_rows([0.6, 0.3, 0.1]), {})
    (dec,) = summary["decisions"]
    cell = next(c for c in summary["cells"] if c["variant"] == "ngram")
    assert cell["distribution_test"]["p_value"] > 0.001
    assert dec["decision"] == "promote"
    assert summary["routing"]["routes"]["chat"]["evidence"]["temperatures"] == [0.7]


def test_report_shows_the_test_of_each_sampled_cell() -> None:
    from trtspec.bench.report_md import render_markdown

    summary = build_summary(_sampled_rows([0.6, 0.3, 0.1]), {})
    cell = next(c for c in summary["cells"] if c["variant"] == "ngram")
    t = cell["distribution_test"]
    rows = table_rows(summary)
    assert rows == [
        [
            "chat",
            "ngram(k=4)",
            "concurrency=1",
            "0.7",
            "120",
            f"chi-square {t['statistic']:.1f}, dof 2, p = {t['p_value']:.2g} (n = 120/120)",
            "-",
        ]
    ]
    md = render_markdown(summary)
    assert "## At temperature > 0" in md and rows[0][5] in md
    # too few distinct first tokens: said, not computed
    few = build_summary(_sampled_rows([0.6, 0.3, 0.1], n=4), {})
    assert table_rows(few)[0][5] == "not testable (fewer than two first-token categories)"
    # a T=0 run has no such section
    assert (
        table_rows(build_summary([row("c", "baseline", 0, 1.0), row("c", "v", 0, 1.0)], {})) == []
    )


def _quality_rows(base_pass: list[bool], var_pass: list[bool]) -> list[dict[str, Any]]:
    rows = []
    for i, (bp, vp) in enumerate(zip(base_pass, var_pass, strict=True)):
        for variant, ok, lat, k in (("baseline", bp, 100.0, None), ("draft", vp, 99.0, 3)):
            r = row("json", variant, i, lat * (1.02 if i % 2 else 0.98), k=k, temp=0.7)
            r["quality"] = {"json_schema": {"status": "pass" if ok else "fail"}}
            rows.append(r)
    return rows


def test_a_sampled_quality_gap_breaks_only_when_the_paired_interval_shows_it() -> None:
    # 3 of 10 against the baseline's 6 of 10 on the same prompts, each arm
    # sampling its own outputs: not shown worse, so not excluded for quality
    base = [True, False, False, True, True, False, True, False, True, True]
    var = [False, False, False, True, False, False, True, False, True, False]
    summary = build_summary(_quality_rows(base, var), {})
    (dec,) = summary["decisions"]
    assert dec["decision"] == "inconclusive"
    cell = next(c for c in summary["cells"] if c["variant"] == "draft")
    assert cell["quality_difference"]["point"] == -0.3
    assert cell["quality_difference"]["ci_high"] > 0
    assert any("not shown below 0 at this temperature" in r for r in dec["reasons"])
    # every prompt passing on the baseline and failing on the variant is
    # shown: excluded for quality, as at T=0
    summary = build_summary(_quality_rows([True] * 12, [False] * 12), {})
    (dec,) = summary["decisions"]
    assert dec["decision"] == "exclude"
    assert any("quality pass 0% < 95% and below baseline 100%" in r for r in dec["reasons"])
