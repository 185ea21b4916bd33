"""Summary numbers recomputed from synthetic rows, decisions on constructed
runs, routing.yaml, report rendering (HTML with its PNGs), and the `trtspec
report` command's exit codes, stdout and stderr."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from trtspec.bench import stats
from trtspec.bench.decide import decide, judge_cell
from trtspec.bench.records import read_requests
from trtspec.bench.report import render_run
from trtspec.bench.report_console import console_lines
from trtspec.bench.summary import DEFAULT_DECISION, build_summary, summarize_rows
from trtspec.cli.main import cli
from trtspec.errors import BenchError


def row(
    route: str,
    variant: str,
    sample: int,
    latency: float,
    *,
    k: int | None = None,
    tokens: int = 40,
    ttft: float = 10.0,
    out: str = "same",
    error: str | None = None,
    temp: float = 0.0,
    warmup: bool = False,
    quality: dict | None = None,
    drafted: int | None = None,
    accepted: int | None = None,
    rounds: int | None = None,
    positions: tuple[list[int], list[int]] | None = None,
) -> dict[str, Any]:
    spec = variant != "baseline"
    return {
        "schema_version": 1,
        "route": route,
        "variant": variant,
        "model": variant,
        "mode": "ngram" if spec else "none",
        "speculative": spec,
        "num_speculative_tokens": k,
        "sample_index": sample,
        "prompt_index": sample,
        "temperature": temp,
        "load": "concurrency=1",
        "concurrency": 1,
        "request_rate": None,
        "warmup": warmup,
        "send_time_unix": 1000.0 + sample,
        "completion_tokens": tokens,
        "prompt_tokens": 12,
        "ttft_ms": ttft,
        "latency_ms": latency,
        "tpot_ms": (latency - ttft) / (tokens - 1),
        "tokens_per_second": tokens / (latency / 1000.0),
        "error": error,
        "output_ids_hash": out,
        "text_hash": out,
        "quality": quality or {},
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "rounds": rounds,
        "drafted_per_position": (
            None if positions is None else {str(j + 1): n for j, n in enumerate(positions[0])}
        ),
        "accepted_per_position": (
            None if positions is None else {str(j + 1): n for j, n in enumerate(positions[1])}
        ),
        "client_overhead_ms": 0.2,
        "send_lag_ms": None,
    }


BASE_LAT = [100.0, 120.0, 90.0, 110.0, 105.0, 95.0, 115.0, 100.0]


def run_rows() -> list[dict[str, Any]]:
    rows = [row("code", "baseline", 0, 999.0, warmup=True)]
    for i, lat in enumerate(BASE_LAT):
        rows.append(row("code", "baseline", i, lat, quality={"ruff": {"status": "pass"}}))
        rows.append(
            row(
                "code",
                "fast",
                i,
                lat / 2,
                k=4,
                drafted=40,
                accepted=30,
                rounds=10,
                quality={"ruff": {"status": "pass"}},
                positions=([10, 10, 10, 10], [10, 9, 7, 4]),
            )
        )
        rows.append(
            row(
                "code",
                "fast",
                i,
                lat / 1.5,
                k=2,
                drafted=20,
                accepted=18,
                rounds=20,
                quality={"ruff": {"status": "pass"}},
            )
        )
        rows.append(row("code", "slow", i, lat * 1.5, drafted=40, accepted=5, rounds=20))
        rows.append(
            row("code", "lossy", i, lat / 2, out=f"diff{i}", drafted=10, accepted=9, rounds=5)
        )
        rows.append(row("code", "noisy", i, lat * (0.7 if i % 2 else 1.3)))
        rows.append(row("chat", "baseline", i, lat, tokens=8))
        rows.append(
            row("chat", "fast", i, lat * 0.9, tokens=8, k=4, error="boom" if i == 0 else None)
        )
    return rows


def cells_by(summary_cells: list[dict[str, Any]]) -> dict[tuple[str, str, Any], dict]:
    return {(c["route"], c["variant"], c["num_speculative_tokens"]): c for c in summary_cells}


def test_cells_recomputed_from_rows() -> None:
    rows = run_rows()
    cells = cells_by(summarize_rows(rows))
    base, fast = cells[("code", "baseline", None)], cells[("code", "fast", 4)]
    assert base["count"] == 8  # the warmup row is excluded
    assert base["latency_ms"]["p50"] == stats.percentile(BASE_LAT, 50)
    assert base["latency_ms"]["p95"] == pytest.approx(stats.percentile(BASE_LAT, 95))
    assert fast["latency_ms"]["p95"] == pytest.approx(stats.percentile(BASE_LAT, 95) / 2)
    assert fast["acceptance_rate"] == pytest.approx(240 / 320)
    assert fast["mean_accepted_length"] == pytest.approx((240 + 80) / 80)
    assert base["acceptance_rate"] is None
    assert fast["speedup"]["point"] == pytest.approx(2.0)
    assert fast["speedup"]["pairs"] == 8
    assert fast["equal_rate"] == 1.0
    assert fast["quality_pass_rate"] == 1.0
    assert fast["p95_latency_regression"] == pytest.approx(-0.5)
    assert fast["tokens_per_second"]["mean"] == pytest.approx(
        sum(40 / (lat / 2000.0) for lat in BASE_LAT) / 8
    )
    noisy = cells[("code", "noisy", None)]
    expected = math.exp(sum(math.log(1 / (0.7 if i % 2 else 1.3)) for i in range(8)) / 8)
    assert noisy["speedup"]["point"] == pytest.approx(expected)
    assert cells[("code", "lossy", None)]["equal_rate"] == 0.0
    chat_fast = cells[("chat", "fast", 4)]
    assert (chat_fast["errors"], chat_fast["error_rate"]) == (1, 1 / 8)
    assert chat_fast["speedup"]["pairs"] == 7
    assert chat_fast["short_output"] is True
    assert base["short_output"] is False


def test_decisions_on_constructed_run() -> None:
    summary = build_summary(run_rows(), {"settings": {"decision": dict(DEFAULT_DECISION)}})
    got = {(d["route"], d["variant"], d["num_speculative_tokens"]): d for d in summary["decisions"]}
    assert got[("code", "fast", 4)]["decision"] == "promote"
    assert got[("code", "fast", 4)]["best_k"] is True
    assert got[("code", "fast", 2)]["decision"] == "promote"
    assert got[("code", "fast", 2)]["best_k"] is False
    slow = got[("code", "slow", None)]
    assert slow["decision"] == "exclude"
    assert slow["reasons"][0].startswith("concurrency=1 T=0: slower than baseline, speedup 0.67x")
    lossy = got[("code", "lossy", None)]
    assert lossy["decision"] == "exclude"
    assert lossy["reasons"] == [
        "concurrency=1 T=0: output equals baseline in 0% of prompts at T=0 (need 100%)"
    ]
    assert got[("code", "noisy", None)]["decision"] == "inconclusive"
    chat = got[("chat", "fast", 4)]
    assert chat["decision"] == "exclude"  # 12.5% errors > 1%
    assert chat["short_output"] is True
    assert summary["routing"] == {
        "schema_version": 1,
        "default_variant": "baseline",
        "routes": {
            "code": {
                "variant": "fast",
                "num_draft_tokens": 4,
                "canary_percent": 5,  # the default canary
                "decision": "promote",
                "fallback_variant": "baseline",
                "evidence": {
                    "speedup": 2.0,
                    "speedup_ci": [2.0, 2.0],
                    "confidence": 0.95,
                    "tokens_per_second_change": 1.0,
                    "latency_change": -0.5,
                    "pairs": 8,
                    "load": "concurrency=1",
                    "temperature": 0.0,
                    "temperatures": [0.0],
                },
            },
            "chat": {"variant": "baseline", "decision": "exclude"},
        },
    }
    assert summary["totals"] == {
        "requests": 64,
        "errors": 1,
        "error_rate": 1 / 64,
        "incidents": 0,
        "warmup_requests": 1,
    }


def test_judge_cell_rules() -> None:
    d = dict(DEFAULT_DECISION)
    cell = {
        "load": "concurrency=4",
        "temperature": 0.7,
        "error_rate": 0.0,
        "quality_pass_rate": 0.5,
        "baseline_quality_pass_rate": 0.5,
        "equal_rate": None,
        "speedup": {"point": 1.3, "ci_low": 1.2, "ci_high": 1.4},
        "pairs": 8,
        "p95_latency_regression": 0.2,
    }
    # quality as bad as the baseline's own does not count against the variant
    assert judge_cell(cell, d) == ("inconclusive", ["concurrency=4 T=0.7: p95 latency +20% > +10%"])
    cell["p95_latency_regression"] = 0.0
    assert judge_cell(cell, d)[0] == "promote"
    cell["quality_pass_rate"] = 0.4
    assert judge_cell(cell, d) == (
        "exclude",
        ["concurrency=4 T=0.7: quality pass 40% < 95% and below baseline 50%"],
    )
    cell["quality_pass_rate"] = 0.5
    cell["speedup"] = {"point": 1.04, "ci_low": 0.98, "ci_high": 1.1}
    assert judge_cell(cell, d) == (
        "inconclusive",
        ["concurrency=4 T=0.7: speedup 1.04x [0.98, 1.10] not above 1.05"],
    )
    cell["speedup"] = None
    assert judge_cell(cell, d) == ("inconclusive", ["concurrency=4 T=0.7: no paired baseline"])


def test_too_few_pairs_is_inconclusive_whatever_the_numbers() -> None:
    d = {**DEFAULT_DECISION, "min_pairs": 5}
    cell = {
        "load": "concurrency=1",
        "temperature": 0.0,
        "error_rate": 0.0,
        "quality_pass_rate": None,
        "baseline_quality_pass_rate": None,
        "equal_rate": 1.0,
        "speedup": {"point": 3.0, "ci_low": 2.5, "ci_high": 3.5},
        "pairs": 4,
        "p95_latency_regression": 0.0,
    }
    assert judge_cell(cell, d) == (
        "inconclusive",
        ["concurrency=1 T=0: only 4 paired prompts (< min_pairs 5)"],
    )
    cell["speedup"] = {"point": 0.3, "ci_low": 0.25, "ci_high": 0.35}
    cell["equal_rate"] = 0.5
    assert judge_cell(cell, d) == (
        "inconclusive",
        [
            "concurrency=1 T=0: output equals baseline in 50% of prompts at T=0 (need 100%)",
            "concurrency=1 T=0: only 4 paired prompts (< min_pairs 5)",
        ],
    )
    cell["pairs"] = 5
    assert judge_cell(cell, d)[0] == "exclude"


def _disagreeing_rows() -> list[dict[str, Any]]:
    """Every paired prompt is 10% faster on the variant, yet its unpaired p50
    latency is higher and its mean tok/s lower: the baseline also answered
    cheap prompts the variant never got (its cell stopped earlier), which pull
    the baseline's unpaired numbers down."""
    base = [10.0, 11.0, 12.0, 100.0, 110.0, 120.0, 130.0]
    rows = []
    for i, lat in enumerate(base):
        rows.append(row("r", "baseline", i, lat))
        rows.append(row("r", "v", i, lat / 1.1, k=2))
    # the baseline also answered three more cheap prompts the variant never got
    for i in range(7, 10):
        rows.append(row("r", "baseline", i, 9.0))
    return rows


def test_headline_follows_the_paired_estimate_not_unpaired_medians() -> None:
    summary = build_summary(_disagreeing_rows(), {})
    cells = cells_by(summary["cells"])
    base, var = cells[("r", "baseline", None)], cells[("r", "v", 2)]
    # unpaired: the variant looks slower on every detail-table number
    assert var["latency_ms"]["p50"] > base["latency_ms"]["p50"]
    assert var["tokens_per_second"]["mean"] < base["tokens_per_second"]["mean"]
    # paired: 10% faster on each of its 7 prompts
    dec = summary["decisions"][0]
    h = dec["headline"]
    assert h["speedup"]["point"] == pytest.approx(1.1)
    assert h["tokens_per_second_change"]["point"] == pytest.approx(0.1)
    assert h["latency_change"]["point"] == pytest.approx(1 / 1.1 - 1)
    assert h["pairs"] == 7
    line = console_lines(summary)[0]
    assert "speedup 1.10x [1.10, 1.10]  tok/s +10%  latency -9% [-9%, -9%]  7 pairs" in line
    # routing.yaml and the reports carry the same estimate
    entry = summary["routing"]["routes"]["r"]
    assert entry["evidence"]["speedup"] == pytest.approx(1.1)
    assert entry["evidence"]["latency_change"] == pytest.approx(round(1 / 1.1 - 1, 4))


@pytest.mark.parametrize("seed", range(20))
def test_headline_signs_never_disagree(seed: int) -> None:
    import random

    rng = random.Random(seed)
    rows = []
    for i in range(8):
        lat = rng.uniform(10, 200)
        rows.append(row("r", "baseline", i, lat, tokens=rng.randint(5, 60)))
        rows.append(row("r", "v", i, lat * rng.uniform(0.5, 1.6), k=2, tokens=rng.randint(5, 60)))
    h = build_summary(rows, {})["decisions"][0]["headline"]
    s = h["speedup"]
    for key in ("point", "ci_low", "ci_high"):
        assert (s[key] > 1) == (h["tokens_per_second_change"][key] > 0)
    assert (s["point"] > 1) == (h["latency_change"]["point"] < 0)
    assert (s["ci_low"] > 1) == (h["latency_change"]["ci_high"] < 0)


def test_decide_with_rollout_settings() -> None:
    cells = summarize_rows(run_rows())
    _, routing = decide(
        cells,
        dict(DEFAULT_DECISION),
        rollout={"canary_percent": 25, "fallback_variant": "baseline"},
    )
    assert routing["routes"]["code"]["canary_percent"] == 25


def _write_run(tmp_path: Path, rows: list[dict[str, Any]], torn: bool = False) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if torn:
        text += '{"route": "code", "variant": "fa'  # the process died mid-line
    (run / "requests.jsonl").write_text(text)
    return run


def test_render_run_writes_every_artefact(tmp_path: Path) -> None:
    run = _write_run(tmp_path, run_rows(), torn=True)
    summary = render_run(run)
    for name in (
        "summary.json",
        "routing.yaml",
        "report.md",
        "report.html",
        "plots/speedup.png",
        "plots/latency_code.png",
        "plots/latency_chat.png",
        "plots/acceptance_by_position_code.png",
    ):
        assert (run / name).is_file(), name
    assert (run / "plots/speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (run / "report.html").read_text()
    for src in (
        "plots/speedup.png",
        "plots/latency_code.png",
        "plots/acceptance_by_position_code.png",
    ):
        assert f"src='{src}'" in html
    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk["schema_version"] == 1
    assert on_disk["complete"] is False  # no run.json: an interrupted run
    assert on_disk["totals"]["requests"] == 64
    assert yaml.safe_load((run / "routing.yaml").read_text()) == summary["routing"]
    # the router's own loader (trtspec repo --routing) accepts what bench writes
    from trtspec.artifacts.routing import load_routing

    table = load_routing(run / "routing.yaml")
    assert table.routes["code"].variant == "fast"
    assert table.routes["code"].num_draft_tokens == 4
    md = (run / "report.md").read_text()
    assert "route=code  baseline" in md
    assert not list(run.glob("**/.*.tmp"))


def test_console_lines_use_summary_numbers() -> None:
    summary = build_summary(run_rows(), {})
    lines = console_lines(summary)
    fast = next(
        d
        for d in summary["decisions"]
        if d["variant"] == "fast" and d["best_k"] and d["route"] == "code"
    )
    b = round(fast["headline"]["baseline_tokens_per_second"])
    assert lines[0] == (
        f"route=code  baseline {b} tok/s  fast(k=4)  speedup 2.00x [2.00, 2.00]  "
        "tok/s +100%  latency -50% [-50%, -50%]  8 pairs  quality pass  "
        "→ promote"
    )
    assert any(line.endswith("→ exclude  (short outputs)") for line in lines)


def test_read_requests_rejects_a_broken_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"route": "a", "variant": "b"}\nnot json\n{"route": "a", "variant": "b"}\n')
    with pytest.raises(BenchError) as exc:
        read_requests(path)
    assert exc.value.message == f"{path}:2: not a JSON object (Expecting value)"


# -- the CLI --------------------------------------------------------------------------------


def test_cli_report_prints_decisions(tmp_path: Path) -> None:
    run = _write_run(tmp_path, run_rows())
    res = CliRunner().invoke(cli, ["report", str(run), "--no-plots", "--max-error-rate", "0.5"])
    assert res.exit_code == 0, res.output
    summary = json.loads((run / "summary.json").read_text())
    assert res.stdout.splitlines() == console_lines(summary)
    assert f"report: {run / 'report.html'}" in res.stderr
    assert "route=" not in res.stderr


def test_cli_report_json_format(tmp_path: Path) -> None:
    run = _write_run(tmp_path, run_rows())
    res = CliRunner().invoke(
        cli, ["report", str(run), "--no-plots", "--format", "json", "--max-error-rate", "0.5"]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["routing"]["routes"]["code"]["variant"] == "fast"


def test_cli_gate_breach_exits_3(tmp_path: Path) -> None:
    run = _write_run(tmp_path, run_rows())
    res = CliRunner().invoke(
        cli,
        [
            "report",
            str(run),
            "--no-plots",
            "--max-error-rate",
            "0.5",
            "--fail-on",
            "speedup<1.0@code,error_rate>0.01",
        ],
    )
    assert res.exit_code == 3, res.output
    # noisy's geometric-mean speedup is above 1 (1/sqrt(0.7*1.3)), so only slow breaches
    assert res.stderr.splitlines()[-3:] == [
        "Error: --fail-on breached:",
        "  speedup<1@code: speedup=0.6667 at route=code variant=slow (concurrency=1 T=0.0)",
        "  error_rate>0.01: error_rate=0.125 at route=chat variant=fast (concurrency=1 T=0.0 k=4)",
    ]
    assert res.stdout.startswith("route=code")


def test_cli_too_many_failures_exits_1(tmp_path: Path) -> None:
    run = _write_run(tmp_path, run_rows())
    res = CliRunner().invoke(cli, ["report", str(run), "--no-plots", "--max-error-rate", "0.01"])
    assert res.exit_code == 1, res.output
    assert "Error: 1 of 64 measured requests failed (1.6% > --max-error-rate 1.0%)" in res.stderr
    assert f"Hint: see the `error` field in {run / 'requests.jsonl'}" in res.stderr


def test_cli_report_usage_and_missing_run(tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "none")])
    assert res.exit_code == 1
    assert res.stdout == ""
    assert res.stderr == (
        f"Error: {tmp_path / 'none'}: not a folder\n"
        "Hint: pass a run folder such as results/<run>/\n"
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "requests.jsonl").write_text("")
    res = CliRunner().invoke(cli, ["report", str(empty)])
    assert res.exit_code == 1
    assert res.stderr.startswith(f"Error: {empty / 'requests.jsonl'}: no completed requests")
    res = CliRunner().invoke(cli, ["report", str(empty), "--fail-on", "speedup=1"])
    assert res.exit_code == 2
    assert "Invalid value for '--fail-on': cannot parse 'speedup=1'" in res.stderr


def test_cells_flag_prompts_whose_cache_state_differs() -> None:
    rows = []
    for i, lat in enumerate(BASE_LAT[:6]):
        base = row("r", "baseline", i, lat)
        var = row("r", "v", i, lat / 1.2, k=3)
        base["prefix_reused_tokens"] = 0
        var["prefix_reused_tokens"] = 64 if i % 2 else 0  # ABBA: second on odd prompts
        rows += [base, var]
    summary = build_summary(rows, {"prefix_cache": {"policy": "off", "enforced": False}})
    cell = cells_by(summary["cells"])[("r", "v", 3)]
    assert cell["cache_state_differs"] == 3
    assert cell["cache_state_differs_samples"] == [1, 3, 5]
    assert cell["prefix_reused_tokens_mean"] == 32
    assert summary["prefix_cache"] == {"policy": "off", "enforced": False}
    from trtspec.bench.report_md import render_markdown

    text = render_markdown(summary)
    assert (
        "cache state differs: r v(k=3) concurrency=1 T=0: 3 of 6 prompts had a different "
        "prefix_reused_tokens than the baseline (samples [1, 3, 5])"
    ) in text
    assert (
        "prefix cache: off (arms share whatever engine models the repository shares) — not "
        "enforced on this server" in text
    )
    for r in rows:
        r["prefix_reused_tokens"] = 0
    assert cells_by(build_summary(rows, {})["cells"])[("r", "v", 3)]["cache_state_differs"] == 0
