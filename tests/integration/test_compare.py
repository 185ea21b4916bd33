"""`trtspec compare` on two real runs against a real tritonserver serving the
echo orchestrators (tests/integration/test_bench_client.py's fixtures): the
same route benched at k=3 and then at k=1 with one prompt added to the route,
compared as a table, as JSON, as an HTML page, and through a --fail-on gate
that exits 3. Also checks that each run records its fingerprint in
summary.json and routing.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from tests.integration.test_bench_client import _write_spec, echo_repo, server  # noqa: F401
from trtspec import fingerprint
from trtspec.bench.runner import BenchOptions, run_benchmark
from trtspec.cli.main import cli
from trtspec.spec import load_spec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_runs(server: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp("compare")
    spec_path = _write_spec(root, requests=4, concurrency="[1]")
    a, b = root / "run-k3", root / "run-k1"
    run_benchmark(
        load_spec(spec_path),
        BenchOptions(
            output_dir=a,
            endpoint=server.grpc_url,
            routes=["copy"],
            variants=["fast"],
            num_draft_tokens=[3],
            plots=False,
        ),
    )
    with open(root / "routes" / "copy.jsonl", "a") as fh:
        fh.write(json.dumps({"prompt": "A fifth prompt, never sampled. "}) + "\n")
    run_benchmark(
        load_spec(spec_path),
        BenchOptions(
            output_dir=b,
            endpoint=server.grpc_url,
            routes=["copy"],
            variants=["fast"],
            num_draft_tokens=[1],
            plots=False,
        ),
    )
    return a, b


def test_each_run_records_its_fingerprint(two_runs: tuple[Path, Path]) -> None:
    a, _ = two_runs
    summary = json.loads((a / "summary.json").read_text())
    fp = summary["fingerprint"]
    assert fp["routes"]["copy"]["sampling"] == {
        "temperatures": [0.0],
        "top_p": 1.0,
        "top_k": 0,
        "seed": 1234,
        "max_tokens": 16,
    }
    assert fp["versions"]["tritonserver"] == "2.51.0"
    assert fp["repository"] is None  # benched an endpoint: no repository of ours to hash
    assert yaml.safe_load((a / "routing.yaml").read_text())["fingerprint"] == fp


def test_compare_json(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    res = CliRunner().invoke(cli, ["compare", str(a), str(b), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert (data["run_a"], data["run_b"]) == ("run-k3", "run-k1")
    rows = {(r["route"], r["variant"]): r for r in data["rows"]}
    assert set(rows) == {("copy", "baseline"), ("copy", "fast")}
    fast = rows[("copy", "fast")]
    assert fast["num_speculative_tokens"] == {"a": 3, "b": 1}
    # the echo model accepts every drafted token: 16 tokens in 4 rounds of 4, or 8 of 2
    assert fast["acceptance_rate"] == {"a": 1.0, "b": 1.0}
    assert fast["mean_accepted_length"] == {"a": 4.0, "b": 2.0}
    assert fast["changes"]["acceptance_drop"] == 0.0
    assert fast["changes"]["mean_accepted_length_drop"] == 2.0
    sa, sb = fast["speedup"]["a"], fast["speedup"]["b"]
    assert fast["changes"]["speedup_drop"] == pytest.approx(sa["point"] - sb["point"])
    assert fast["speedup_ci_overlap"] == (
        sa["ci_low"] <= sb["ci_high"] and sb["ci_low"] <= sa["ci_high"]
    )
    summary_a = json.loads((a / "summary.json").read_text())
    cell = next(c for c in summary_a["cells"] if c["variant"] == "fast")
    assert fast["ttft_p95_ms"]["a"] == cell["ttft_ms"]["p95"]
    assert fast["quality_pass_rate"] == {"a": 1.0, "b": 1.0}
    assert rows[("copy", "baseline")]["speedup"] == {"a": None, "b": None}
    prompts = Path(summary_a["settings"]["routes"]["copy"]["prompts"])
    old = summary_a["fingerprint"]["routes"]["copy"]["prompts"]
    assert data["fingerprint_changes"] == [
        f"routes.copy.prompts: {old} → {fingerprint.file_hash(prompts)}"
    ]
    assert data["only_in_a"] == [] and data["only_in_b"] == []


def test_compare_table_and_html(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    page = tmp_path / "compare.html"
    res = CliRunner().invoke(cli, ["compare", str(a), str(b), "--html", str(page)])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == [
        "route",
        "variant",
        "load",
        "T",
        "k",
        "acceptance",
        "Δ",
        "mean_acc_len",
        "speedup",
        "A",
        "speedup",
        "B",
        "CIs",
        "overlap",
        "ttft_p50_ms",
        "ttft_p95_ms",
        "quality",
    ]
    fast = next(ln for ln in lines if ln.startswith("copy") and " fast " in ln).split()
    assert fast[:8] == [
        "copy",
        "fast",
        "concurrency=1",
        "0",
        "3→1",
        "1.00→1.00",
        "+0.00",
        "4.00→2.00",
    ]
    assert fast[-1] == "100%→100%"
    assert lines[-2] == "fingerprint: 1 difference"
    assert lines[-1].startswith("  routes.copy.prompts: ")
    assert res.stderr == f"compare: {page}\n"
    text = page.read_text()
    assert "<img alt='speedup A vs B with 95% CI' src='data:image/png;base64,iVBORw0KGgo" in text
    assert "<td>4.00→2.00</td>" in text


def test_compare_gate_exits_3(two_runs: tuple[Path, Path]) -> None:
    a, b = two_runs
    ok = CliRunner().invoke(cli, ["compare", str(a), str(b), "--fail-on", "acceptance_drop>0.1"])
    assert ok.exit_code == 0, ok.output
    res = CliRunner().invoke(
        cli, ["compare", str(a), str(b), "--fail-on", "mean_accepted_length_drop>1@copy/fast"]
    )
    assert res.exit_code == 3, res.output
    assert res.stderr == (
        "Error: --fail-on breached:\n  mean_accepted_length_drop>1@copy/fast: "
        "mean_accepted_length_drop=2 at route=copy variant=fast (concurrency=1 T=0.0 k=1)\n"
    )
    bad = CliRunner().invoke(cli, ["compare", str(a), str(b), "--fail-on", "acceptance<0.1"])
    assert bad.exit_code == 2
    assert "unknown metric 'acceptance'" in bad.stderr
    assert "did you mean 'acceptance_drop'?" in bad.stderr
