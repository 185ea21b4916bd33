"""Draft length per load level: a k sweep crossed with concurrency levels
writes the best k per level into routing.yaml as ``draft_len_schedule`` (the
LLM API's form: the largest level ≤ the in-flight count applies), the
router's loader validates it, and ``InFlight.admit`` applies it by the
route's own in-flight count."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.test_bench_summary import row
from tests.unit.test_decide_concurrency import BASE

from trtspec.artifacts.routing import InFlight, choose, parse_routing
from trtspec.bench.decide import draft_len_schedule, k_table
from trtspec.bench.report_md import render_markdown
from trtspec.bench.summary import build_summary
from trtspec.errors import RepoError


def k_sweep(speedups: dict[int, dict[int, float]]) -> list[dict[str, Any]]:
    """{k: {level: speedup}} as rows (±2% jitter so intervals are narrow)."""
    rows: list[dict[str, Any]] = []
    levels = sorted({c for per in speedups.values() for c in per})
    for conc in levels:
        for i, lat in enumerate(BASE):
            b = row("rag", "baseline", i, lat)
            b.update(load=f"concurrency={conc}", concurrency=conc)
            rows.append(b)
            for k, per in speedups.items():
                jitter = 1.0 + (0.02 if i % 2 else -0.02)
                r = row("rag", "ngram", i, lat / per[conc] * jitter, k=k)
                r.update(load=f"concurrency={conc}", concurrency=conc)
                rows.append(r)
    return rows


def test_best_k_per_level_goes_into_routing() -> None:
    # k=4 wins most alone, k=2 holds up under load, k=6 loses at 8
    summary = build_summary(
        k_sweep({2: {1: 1.3, 8: 1.25}, 4: {1: 1.6, 8: 1.1}, 6: {1: 1.5, 8: 0.8}}), {}
    )
    entry = summary["routing"]["routes"]["rag"]
    # k=2 serves every level (no cap) and wins at 1 and at 8, so it takes over
    # right after level 1, where k=4 was best
    assert entry["num_draft_tokens"] == 2
    assert entry["draft_len_schedule"] == {1: 4, 2: 2}
    table = parse_routing(summary["routing"])
    assert table.routes["rag"].draft_len_schedule == ((1, 4), (2, 2))
    # the report names the k of each level and what routing.yaml took
    headers, rows = k_table(summary)
    assert headers == ["route", "variant", "concurrency=1", "concurrency=8", "routing.yaml"]
    assert rows == [
        [
            "rag",
            "ngram",
            "k=4 (1.60x, promote)",
            "k=2 (1.25x, promote)",
            "draft_len_schedule {1: 4, 2: 2} at every load",
        ]
    ]
    assert "## Draft length per load" in render_markdown(summary)


def test_a_shorter_k_that_wins_under_load_lifts_the_cap() -> None:
    # as the Spec-Bench run measured on summarization: k=5 wins alone but is
    # undecided at 4 in flight, where k=2 wins (and k=2 is undecided alone)
    sweep = k_sweep({2: {1: 1.04, 4: 1.48}, 5: {1: 1.36, 4: 1.0}})
    summary = build_summary(sweep, {})
    by_k = {d["num_speculative_tokens"]: d for d in summary["decisions"]}
    assert (by_k[5]["decision"], by_k[5]["max_concurrency"]) == ("promote", 1)
    assert by_k[2]["decision"] == "inconclusive"
    entry = summary["routing"]["routes"]["rag"]
    # the route serves both loads: k=5 below 4 in flight, k=2 from 4 on
    assert entry["num_draft_tokens"] == 5
    assert entry["draft_len_schedule"] == {1: 5, 4: 2}
    assert "max_concurrency" not in entry
    # a k whose output broke somewhere is never switched to: capped as before
    for r in sweep:
        if r["variant"] == "ngram" and r["num_speculative_tokens"] == 2 and r["concurrency"] == 1:
            r["output_ids_hash"] = r["text_hash"] = f"other-{r['sample_index']}"
    entry = build_summary(sweep, {})["routing"]["routes"]["rag"]
    assert entry["max_concurrency"] == 1 and "draft_len_schedule" not in entry


def test_switch_waits_for_its_level_when_unproven_below() -> None:
    decisions = [
        {
            "route": "r",
            "variant": "v",
            "num_speculative_tokens": k,
            "levels": [
                {"concurrency": c, "decision": d, "speedup": {"point": p}} for c, d, p in levels
            ],
        }
        for k, levels in {
            4: [(1, "promote", 1.6), (4, "promote", 1.2), (16, "inconclusive", 1.0)],
            2: [(1, "inconclusive", 1.1), (4, "promote", 1.1), (16, "promote", 1.2)],
        }.items()
    ]
    top = {"route": "r", "variant": "v", "max_concurrency": None}
    # k=4 is best at 1 and 4; k=2 won at 4 and at 16, so it takes over after 4
    assert draft_len_schedule(decisions, top) == {1: 4, 5: 2}
    # not proven at 4: k=2 starts only at 16, where it was measured
    decisions[1]["levels"][1]["decision"] = "inconclusive"
    assert draft_len_schedule(decisions, top) == {1: 4, 16: 2}
    assert draft_len_schedule(decisions, {**top, "max_concurrency": 4}) is None
    one_k = [d for d in decisions if d["num_speculative_tokens"] == 4]
    assert draft_len_schedule(one_k, top) is None


def test_router_applies_the_schedule_by_in_flight_count() -> None:
    table = parse_routing(
        {"routes": {"rag": {"variant": "ngram", "draft_len_schedule": {"1": 4, "3": 2}}}}
    )
    flight = InFlight()
    choices = [flight.admit(table, "rag", choose(table, "rag", f"id-{i}")) for i in range(4)]
    assert [c.num_draft_tokens for c in choices] == [4, 4, 2, 2]
    for c in choices[1:]:
        flight.release(table, "rag", c)
    assert flight.admit(table, "rag", choose(table, "rag", "again")).num_draft_tokens == 4
    assert table.to_dict()["routes"]["rag"]["draft_len_schedule"] == {1: 4, 3: 2}


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            {},
            "routes.rag.draft_len_schedule: expected a mapping of in-flight level to draft length",
        ),
        ({"x": 4}, "routes.rag.draft_len_schedule.x: level must be a positive integer"),
        ({0: 4}, "routes.rag.draft_len_schedule.0: level must be a positive integer"),
        ({1: 0}, "routes.rag.draft_len_schedule.1: draft length must be a positive integer, got 0"),
    ],
)
def test_bad_schedules_are_named(schedule: Any, message: str) -> None:
    with pytest.raises(RepoError) as err:
        parse_routing({"routes": {"rag": {"variant": "ngram", "draft_len_schedule": schedule}}})
    assert err.value.message == f"routing.yaml: {message}"
