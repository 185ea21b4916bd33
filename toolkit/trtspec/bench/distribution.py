"""At temperature > 0 a lossless variant cannot be checked token by token
(the same seed draws different tokens once a draft is accepted), but its
output must still follow the target's distribution. Over a cell's paired
prompts, each arm's first generated token is a draw from the target's
next-token distribution for that prompt; pooled over the same prompts the two
arms' histograms must match. ``first_token_test`` compares them with a
two-sample chi-square test of homogeneity (tokens with an expected count under
5 pooled into one category, the textbook validity rule) and returns the
statistic, degrees of freedom and p-value; bench/decide.py treats p below
``ALPHA`` as broken output at that temperature. The test has little power on
a few dozen prompts — it catches a variant that samples from the wrong
distribution outright, not a subtle bias — and the report says how many
pairs it rests on."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from trtspec.artifacts.bench_run import DistributionTest, RequestRow, Summary
from trtspec.bench.records import pairs_with

ALPHA = 0.001
MIN_EXPECTED = 5.0


def _upper_gamma_regularized(a: float, x: float) -> float:
    """Q(a, x) = Γ(a, x) / Γ(a) (series below a + 1, continued fraction above)."""
    if x <= 0:
        return 1.0
    gln = math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        for _ in range(1000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - gln))
    b = x + 1.0 - a
    c = 1.0 / 1e-300
    d = 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - gln) * h


def chi2_sf(stat: float, dof: int) -> float:
    """P(χ²_dof ≥ stat)."""
    return _upper_gamma_regularized(dof / 2.0, stat / 2.0)


def homogeneity(a: Counter[Any], b: Counter[Any]) -> DistributionTest | None:
    """Two-sample chi-square test that ``a`` and ``b`` come from one
    distribution; ``None`` when fewer than two categories remain."""
    na, nb = sum(a.values()), sum(b.values())
    if not na or not nb:
        return None
    total = na + nb
    cats: dict[Any, tuple[int, int]] = {}
    other = [0, 0]
    for key in set(a) | set(b):
        pooled = a.get(key, 0) + b.get(key, 0)
        if min(na, nb) * pooled / total < MIN_EXPECTED:
            other[0] += a.get(key, 0)
            other[1] += b.get(key, 0)
        else:
            cats[key] = (a.get(key, 0), b.get(key, 0))
    if sum(other):
        cats["<other>"] = (other[0], other[1])
    if len(cats) < 2:
        return None
    stat = 0.0
    for ca, cb in cats.values():
        pooled = ca + cb
        for observed, n in ((ca, na), (cb, nb)):
            expected = n * pooled / total
            stat += (observed - expected) ** 2 / expected
    dof = len(cats) - 1
    return {"statistic": stat, "dof": dof, "p_value": chi2_sf(stat, dof), "samples": [na, nb]}


def first_token_test(
    pairs: list[tuple[RequestRow, RequestRow]],
) -> DistributionTest | None:
    """The homogeneity test on the first token of every pair where both
    arms succeeded and reported one."""
    base: Counter[Any] = Counter()
    var: Counter[Any] = Counter()
    for b, v in pairs:
        if b.get("error") or v.get("error"):
            continue
        if b.get("first_token") is None or v.get("first_token") is None:
            continue
        base[b["first_token"]] += 1
        var[v["first_token"]] += 1
    return homogeneity(base, var)


TABLE_HEADERS = ["route", "variant", "load", "T", "pairs", "first-token test", "quality"]

NOTE = (
    "At T > 0 outputs are not compared token by token: each arm's first token over the "
    f"paired prompts is tested against the baseline's (chi-square homogeneity; p < {ALPHA:g} "
    "counts as broken output), and the route's quality checks apply as at T = 0."
)


def describe(test: DistributionTest | None) -> str:
    if test is None:
        return "not testable (fewer than two first-token categories)"
    return (
        f"chi-square {test['statistic']:.1f}, dof {test['dof']}, p = {test['p_value']:.2g} "
        f"(n = {test['samples'][0]}/{test['samples'][1]})"
    )


def table_rows(summary: Summary) -> list[list[str]]:
    """One row per paired cell measured at a temperature above 0."""
    rows = []
    for c in summary["cells"]:
        if c["temperature"] <= 0.0 or pairs_with(c) is None:
            continue
        k, q = c.get("num_speculative_tokens"), c.get("quality_pass_rate")
        rows.append(
            [
                c["route"],
                c["variant"] if k is None else f"{c['variant']}(k={k})",
                c["load"],
                f"{c['temperature']:g}",
                str(c.get("pairs") or 0),
                describe(c.get("distribution_test")),
                "-" if q is None else f"{q:.0%}",
            ]
        )
    return rows
