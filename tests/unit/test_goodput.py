"""Goodput under latency objectives: which requests meet them, the share and
goodput per cell, the paired share difference (Agresti–Min, checked against a
hand computation), decisions by goodput, the spec rule that goodput needs
objectives, and the report's goodput table and throughput-vs-latency plot."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_bench_summary import row

from trtspec.bench import goodput
from trtspec.bench.report import render_run
from trtspec.bench.report_console import console_lines
from trtspec.bench.summary import DEFAULT_DECISION, build_summary, summarize_rows
from trtspec.errors import SpecError
from trtspec.spec import load_spec

GOAL = {"ttft_ms": 50.0, "itl_ms": None, "latency_ms": 200.0}


def test_meets_each_bound_and_never_on_error() -> None:
    bounds = goodput.active(GOAL)
    assert bounds == {"ttft_ms": 50.0, "latency_ms": 200.0}
    assert goodput.meets(row("r", "baseline", 0, 150.0, ttft=20.0), bounds)
    assert not goodput.meets(row("r", "baseline", 0, 250.0, ttft=20.0), bounds)
    assert not goodput.meets(row("r", "baseline", 0, 150.0, ttft=60.0), bounds)
    assert not goodput.meets(row("r", "baseline", 0, 150.0, error="boom"), bounds)
    itl = goodput.active({"itl_ms": 3.0})
    # (150 - 10) / (40 - 1) = 3.59 ms per token
    assert not goodput.meets(row("r", "baseline", 0, 150.0), itl)
    one_token = {**row("r", "baseline", 0, 150.0), "tpot_ms": None}
    assert goodput.meets(one_token, itl)  # no ITL to hold against the bound


def test_cell_goodput_counts_only_requests_that_meet() -> None:
    rows = [row("r", "baseline", i, lat) for i, lat in enumerate([100.0, 300.0, 150.0, 400.0])]
    g = goodput.cell_goodput(rows, GOAL)
    assert g is not None
    # sends at 1000..1003 s; the last ends at 1003.4 s: span 3.4 s
    span = 3.4
    assert (g["met"], g["requests"], g["share"]) == (2, 4, 0.5)
    assert g["requests_per_second"] == pytest.approx(2 / span)
    assert g["tokens_per_second"] == pytest.approx(80 / span)
    assert goodput.cell_goodput(rows, None) is None
    assert goodput.cell_goodput(rows, {"ttft_ms": None}) is None


def test_paired_share_difference_matches_hand_computation() -> None:
    # 10 pairs: 4 only the variant meets, 0 only the baseline, 5 both, 1 neither
    met, missed = 100.0, 300.0
    pairs = []
    for i in range(10):
        b_lat = met if i < 5 else missed
        v_lat = met if i < 9 else missed
        pairs.append((row("r", "baseline", i, b_lat), row("r", "v", i, v_lat)))
    d = goodput.paired_share_difference(pairs, GOAL)
    assert d is not None
    assert d["table"] == {"both": 5, "only_variant": 4, "only_baseline": 0, "neither": 1}
    # Agresti–Min: add 1/2 to each cell, n* = 12
    p10, p01 = 4.5 / 12, 0.5 / 12
    centre = p10 - p01  # 0.3333
    half = 1.959964 * math.sqrt(((p10 + p01) - centre**2) / 12)  # 0.31275
    assert d["point"] == pytest.approx(0.4)
    assert d["ci_low"] == pytest.approx(centre - half, abs=1e-5)  # 0.02058
    assert d["ci_high"] == pytest.approx(centre + half, abs=1e-5)  # 0.64609
    assert goodput.describe(d) == "+40% [+2%, +65%]"
    # every pair agrees: the interval keeps a width instead of collapsing
    same = goodput.paired_share_difference(pairs[:5], GOAL)
    assert same is not None and same["point"] == 0.0
    assert same["ci_low"] < 0.0 < same["ci_high"]


def _run(variant_lat: list[float], base_lat: list[float]) -> list[dict[str, Any]]:
    rows = []
    for i, (b, v) in enumerate(zip(base_lat, variant_lat, strict=True)):
        rows += [row("r", "baseline", i, b), row("r", "ngram", i, v, k=4)]
    return rows


def _decision(**extra: Any) -> dict[str, Any]:
    return {**DEFAULT_DECISION, "objectives": GOAL, **extra}


@pytest.mark.parametrize(
    ("variant_lat", "verdict", "reason"),
    [
        (
            [150.0] * 10,
            "promote",
            "concurrency=1 T=0: share meeting the objectives +80% [+35%, +98%] vs baseline",
        ),
        (
            [260.0] * 10,
            "inconclusive",
            "concurrency=1 T=0: share meeting the objectives -20% [-43%, +10%] vs baseline, "
            "not above 0",
        ),
    ],
)
def test_decide_by_goodput(variant_lat: list[float], verdict: str, reason: str) -> None:
    base = [250.0] * 8 + [150.0] * 2  # 2 of 10 meet the 200 ms objective
    run = {"settings": {"decision": _decision(decide_by="goodput")}}
    summary = build_summary(_run(variant_lat, base), run)
    (dec,) = summary["decisions"]
    assert dec["decision"] == verdict
    assert dec["reasons"] == [reason]
    # by speedup the same arms reach the same verdicts here, for their own reasons
    summary = build_summary(_run(variant_lat, base), {"settings": {"decision": _decision()}})
    assert summary["decisions"][0]["decision"] == verdict


def test_decide_by_goodput_excludes_an_arm_that_meets_less() -> None:
    base = [150.0] * 10
    variant = [250.0] * 8 + [150.0] * 2
    run = {"settings": {"decision": _decision(decide_by="goodput")}}
    (dec,) = build_summary(_run(variant, base), run)["decisions"]
    assert dec["decision"] == "exclude"
    assert dec["reasons"] == [
        "concurrency=1 T=0: fewer requests meet the objectives, share meeting the "
        "objectives -80% [-98%, -35%] vs baseline"
    ]


def test_console_and_report_show_goodput(tmp_path: Path) -> None:
    base = [250.0] * 8 + [150.0] * 2
    rows = _run([150.0] * 10, base)
    # a second level, so the route gets its Pareto plot either way
    rows += [
        {**r, "load": "concurrency=4", "concurrency": 4, "latency_ms": r["latency_ms"] * 2}
        for r in list(rows)
    ]
    run = {"settings": {"decision": _decision()}, "complete": True}
    (tmp_path / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "run.json").write_text(json.dumps(run))
    summary = build_summary(rows, run)
    line = console_lines(summary)[0]
    assert "goodput 100% vs 20% (+80% [+35%, +98%])" in line
    assert "at concurrency=4:" in console_lines(summary)[1]
    render_run(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Goodput under objectives (TTFT ≤ 50 ms, E2E ≤ 200 ms)" in md
    assert "| r | ngram(k=4) | concurrency=1 | 0 | 10/10 | 100% |" in md
    assert "![r: throughput vs latency](plots/pareto_r.png)" in md
    assert (tmp_path / "plots" / "pareto_r.png").stat().st_size > 1000
    html = (tmp_path / "report.html").read_text()
    assert "Goodput under objectives" in html
    # the Pareto plot has its own section, shown once
    assert "<h2>Throughput vs latency</h2><figure><img src='plots/pareto_r.png'" in html
    assert html.count("plots/pareto_r.png") == 1


def test_summary_without_objectives_has_no_goodput() -> None:
    cells = summarize_rows(_run([150.0] * 10, [250.0] * 10))
    assert all(c["goodput"] is None and c["goodput_difference"] is None for c in cells)


@pytest.mark.parametrize(
    ("decision", "problem"),
    [
        (
            "{decide_by: goodput}",
            "s.yaml:10:31: bench.decision.decide_by: goodput needs latency objectives; "
            "set bench.decision.objectives (ttft_ms, itl_ms and/or latency_ms) or decide "
            "by speedup",
        ),
        (
            "{objectives: {ttft: 200}}",
            "s.yaml:10:33: bench.decision.objectives.ttft: unknown key 'ttft'; "
            "did you mean 'ttft_ms'?",
        ),
        (
            "{objectives: {ttft_ms: 0}}",
            "s.yaml:10:42: bench.decision.objectives.ttft_ms: input should be greater "
            "than 0 (got 0)",
        ),
    ],
)
def test_spec_rules_for_objectives(tmp_path: Path, decision: str, problem: str) -> None:
    from tests.fixtures.specs import copy_example

    spec = copy_example(tmp_path, "small-ngram.yaml")
    path = spec.with_name("s.yaml")
    path.write_text(spec.read_text() + f"bench: {{decision: {decision}}}\n")
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert [i.split("build_specs/", 1)[1] for i in err.value.issues] == [problem]


def test_spec_accepts_objectives(tmp_path: Path) -> None:
    from tests.fixtures.specs import copy_example

    spec = copy_example(tmp_path, "small-ngram.yaml")
    path = spec.with_name("s.yaml")
    path.write_text(
        spec.read_text()
        + "bench: {decision: {decide_by: goodput, objectives: {ttft_ms: 200, itl_ms: 40}}}\n"
    )
    loaded = load_spec(path)
    assert loaded.bench.decision.decide_by == "goodput"
    assert loaded.bench.decision.model_dump(mode="json")["objectives"] == {
        "ttft_ms": 200.0,
        "itl_ms": 40.0,
        "latency_ms": None,
    }
