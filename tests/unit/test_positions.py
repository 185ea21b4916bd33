"""Acceptance by draft position: the orchestrator's per-round counting, the
cell curve from orchestrator rows and from an external server's counters, the
'not reported' list for in-engine modes, and the report's plot per route."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_bench_summary import _write_run, row, run_rows

from trtspec.bench.positions import cell_positions, unreported
from trtspec.bench.report import render_run
from trtspec.bench.summary import summarize_rows
from trtspec.runtime.speculate import RoundStats, position_counts


def test_position_counts_per_round() -> None:
    stats = RoundStats()
    for drafted, accepted in [(4, 4), (4, 1), (4, 0), (2, 2), (0, 0)]:
        stats.record(drafted, accepted)
    # position 1 drafted in 4 rounds (not the empty one), accepted in 3
    assert position_counts(stats.per_round) == ([4, 4, 3, 3], [3, 2, 1, 1])
    assert position_counts([]) == ([], [])


def test_cell_curve_from_orchestrator_rows() -> None:
    rows = [
        row("r", "v", i, 50.0, k=4, rounds=5, positions=([5, 5, 4, 2], [4, 3, 1, 0]))
        for i in range(3)
    ]
    rows.append(row("r", "v", 3, 50.0, k=4, error="boom", positions=([9, 9, 9, 9], [9, 9, 9, 9])))
    curve = cell_positions(rows)
    assert curve == [
        {"position": 1, "drafted": 15, "accepted": 12, "rate": 0.8},
        {"position": 2, "drafted": 15, "accepted": 9, "rate": 0.6},
        {"position": 3, "drafted": 12, "accepted": 3, "rate": 0.25},
        {"position": 4, "drafted": 6, "accepted": 0, "rate": 0.0},
    ]


def test_cell_curve_from_external_counters() -> None:
    # vLLM: accepted per position, every step drafted k = 3 tokens
    r = row("r", "vllm_ngram", 0, 50.0, k=3, rounds=10)
    r["accepted_per_position"] = {"1": 8, "2": 5, "3": 1}
    assert [p["rate"] for p in cell_positions([r]) or []] == [0.8, 0.5, 0.1]
    r["rounds"] = None  # no step count: nothing to divide by, no curve
    assert cell_positions([r]) is None


def test_in_engine_modes_are_named_not_estimated(tmp_path: Path) -> None:
    rows = run_rows()
    cells = summarize_rows(rows)
    fast4 = next(c for c in cells if c["variant"] == "fast" and c["num_speculative_tokens"] == 4)
    assert [p["rate"] for p in fast4["position_acceptance"]] == [1.0, 0.9, 0.7, 0.4]
    slow = next(c for c in cells if c["variant"] == "slow")
    assert slow["position_acceptance"] is None
    base = next(c for c in cells if c["variant"] == "baseline")
    assert base["position_acceptance"] is None
    summary = render_run(_write_run(tmp_path, rows))
    assert unreported(summary, "code") == ["fast(k=2)", "slow", "lossy", "noisy"]
    assert (tmp_path / "run" / "plots" / "acceptance_by_position_code.png").stat().st_size > 1000
    # the report shows each curve as a table beside its plot, and names the
    # arms whose runtime reported no per-position counts
    md = (tmp_path / "run" / "report.md").read_text()
    section = md.split("## Acceptance by draft position")[1].split("\n## ")[0]
    assert (
        "| fast(k=4) | concurrency=1 | 0 | 1.00 (80/80) | 0.90 (72/80) | 0.70 (56/80) "
        "| 0.40 (32/80) |" in section
    )
    assert "| slow | concurrency=1 | 0 | not reported by this runtime |" in section
    assert "![code: acceptance by draft position](plots/acceptance_by_position_code.png)" in section
    html = (tmp_path / "run" / "report.html").read_text()
    assert "<h2>Acceptance by draft position</h2>" in html
    assert html.count("acceptance_by_position_code.png") == 1  # beside its table only
