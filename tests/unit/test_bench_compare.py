"""trtspec.bench.compare without a server: which cell stands for a variant
(its decision's best k), CI overlap, and the errors for a folder that holds
no summary. Two real runs are compared in tests/integration/test_compare.py."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from trtspec.bench.compare import compare_summaries
from trtspec.cli.main import cli


def cell(variant: str, k: int | None, point: float, lo: float, hi: float) -> dict:
    return {
        "route": "code",
        "variant": variant,
        "num_speculative_tokens": k,
        "load": "concurrency=1",
        "temperature": 0.0,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 2.0,
        "quality_pass_rate": 1.0,
        "ttft_ms": {"p50": 10.0, "p95": 20.0},
        "speedup": {"point": point, "ci_low": lo, "ci_high": hi},
    }


def summary(run: str, cells: list[dict], best: int) -> dict:
    return {
        "run_id": run,
        "cells": cells,
        "fingerprint": None,
        "decisions": [
            {"route": "code", "variant": "d", "num_speculative_tokens": k, "best_k": k == best}
            for k in (2, 4)
        ],
    }


def test_best_k_stands_for_the_variant_and_overlap_is_computed() -> None:
    a = summary("a", [cell("d", 2, 1.5, 1.4, 1.6), cell("d", 4, 1.2, 1.1, 1.3)], best=2)
    b = summary("b", [cell("d", 2, 1.3, 1.2, 1.45), cell("d", 4, 1.0, 0.9, 1.1)], best=2)
    (row,) = compare_summaries(a, b)["rows"]
    assert row["num_speculative_tokens"] == {"a": 2, "b": 2}
    assert row["speedup_ci_overlap"] is True  # [1.4, 1.6] and [1.2, 1.45]
    assert round(row["changes"]["speedup_drop"], 6) == 0.2
    assert row["changes"]["ttft_p95_increase"] == 0.0
    b = summary("b", [cell("d", 2, 1.3, 1.2, 1.35), cell("d", 4, 1.0, 0.9, 1.1)], best=2)
    assert compare_summaries(a, b)["rows"][0]["speedup_ci_overlap"] is False


def test_folder_without_summary_is_a_clean_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    res = CliRunner().invoke(cli, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert res.exit_code == 1
    assert res.stderr == (
        f"Error: {tmp_path / 'a' / 'summary.json'}: not found\n"
        f"Hint: render it with `trtspec report {tmp_path / 'a'}`\n"
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "summary.json").write_text(json.dumps({"run_id": "b"}))
    (tmp_path / "a" / "summary.json").write_text(json.dumps({"cells": []}))
    res = CliRunner().invoke(cli, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert res.exit_code == 1
    assert res.stderr == (
        f"Error: {tmp_path / 'b' / 'summary.json'}: cells: missing\n"
        f"Hint: re-render it with `trtspec report {tmp_path / 'b'}`\n"
    )
