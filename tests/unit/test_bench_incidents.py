"""Infrastructure incidents in the benchmark's numbers (issue 10, D2/D6): a
request a stub crash or a server restart failed is an error row (``incident``
set) that counts in ``error_rate``, yet never makes a variant ``exclude``; a
run whose server died under ``--endpoint`` is reported incomplete and the CLI
exits 1 saying so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from trtspec.bench.summary import DEFAULT_DECISION, build_summary
from trtspec.cli.main import cli

LAT = [100.0, 120.0, 90.0, 110.0, 105.0, 95.0, 115.0, 100.0]


def row(
    variant: str,
    sample: int,
    latency: float,
    *,
    error: str | None = None,
    incident: str | None = None,
) -> dict[str, Any]:
    spec = variant != "baseline"
    return {
        "schema_version": 1,
        "route": "code",
        "variant": variant,
        "model": variant,
        "mode": "ngram" if spec else "none",
        "speculative": spec,
        "num_speculative_tokens": 4 if spec else None,
        "sample_index": sample,
        "prompt_index": sample,
        "temperature": 0.0,
        "load": "concurrency=1",
        "concurrency": 1,
        "request_rate": None,
        "warmup": False,
        "send_time_unix": 1000.0 + sample,
        "completion_tokens": None if error else 40,
        "prompt_tokens": 12,
        "ttft_ms": None if error else 10.0,
        "latency_ms": None if error else latency,
        "tpot_ms": None,
        "tokens_per_second": None,
        "error": error,
        "incident": incident,
        "output_ids_hash": None if error else "same",
        "text_hash": "same",
        "quality": {},
        "draft_tokens": 40,
        "accepted_tokens": 30,
        "rounds": 10,
        "client_overhead_ms": 0.2,
        "send_lag_ms": None,
    }


CRASH = (
    "the Python-backend stub of model 'fast' (pid 4242) was killed by SIGSEGV; the "
    "requests in flight failed (Socket closed); tritonserver restarted on the same ports"
)


def rows_with(failed: int, *, incident: str | None) -> list[dict[str, Any]]:
    rows = []
    for i, lat in enumerate(LAT):
        rows.append(row("baseline", i, lat))
        if i < failed:  # the failed attempt, then the request sent again
            rows.append(row("fast", i, 0.0, error=CRASH if incident else "boom", incident=incident))
        rows.append(row("fast", i, lat / 2))
    return rows


def summary_of(rows: list[dict[str, Any]], **decision: float) -> dict[str, Any]:
    return build_summary(
        rows, {"settings": {"decision": {**DEFAULT_DECISION, **decision}}, "complete": True}
    )


def test_incident_rows_are_errors_but_never_exclude() -> None:
    summary = summary_of(rows_with(2, incident="stub_crash"))
    cell = next(c for c in summary["cells"] if c["variant"] == "fast")
    assert (cell["count"], cell["errors"], cell["incidents"]) == (10, 2, 2)
    assert cell["error_rate"] == 0.2
    assert summary["totals"]["errors"] == 2 and summary["totals"]["incidents"] == 2
    assert summary["totals"]["error_rate"] == 2 / 18
    decision = summary["decisions"][0]
    assert decision["decision"] == "inconclusive"
    assert decision["reasons"] == [
        "concurrency=1 T=0: 2 request(s) failed by a stub crash or server restart, counted as "
        "errors (error rate 20.0%) > 1.0%: not judged on infrastructure failures"
    ]
    assert summary["routing"]["routes"]["code"] == {
        "variant": "baseline",
        "decision": "inconclusive",
    }


def test_a_promoted_variant_says_its_stub_crashed() -> None:
    summary = summary_of(rows_with(1, incident="stub_crash"), max_error_rate=0.2)
    decision = summary["decisions"][0]
    assert decision["decision"] == "promote"
    assert decision["reasons"][1] == (
        "concurrency=1 T=0: 1 request(s) failed by a stub crash or server restart, counted as "
        "errors (error rate 11.1%)"
    )


def test_the_variants_own_errors_still_exclude() -> None:
    summary = summary_of(rows_with(2, incident=None))
    assert summary["decisions"][0]["decision"] == "exclude"
    assert summary["decisions"][0]["reasons"] == ["concurrency=1 T=0: error rate 20.0% > 1.0%"]


def test_incomplete_run_is_reported_and_exits_1(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = rows_with(0, incident=None)[:6]
    rows.append(
        row(
            "fast",
            3,
            0.0,
            error="[StatusCode.UNAVAILABLE] Socket closed",
            incident="server_unreachable",
        )
    )
    (run / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    reason = (
        "the server at 127.0.0.1:8001 stopped answering ([StatusCode.UNAVAILABLE] Socket closed)"
    )
    (run / "run.json").write_text(
        json.dumps({"run_id": "r", "complete": False, "incomplete_reason": reason, "settings": {}})
    )
    res = CliRunner().invoke(cli, ["report", str(run), "--no-plots"])
    assert res.exit_code == 1, res.output
    assert res.stderr.splitlines()[-2:] == [
        f"Error: the benchmark is incomplete: {reason}",
        f'Hint: partial results are in {run} (summary.json: "complete": false); decisions '
        "there use only the requests that completed",
    ]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["complete"] is False and summary["incomplete_reason"] == reason
    assert "decision: exclude" not in (run / "routing.yaml").read_text()
    assert f"no — incomplete: {reason}" in (run / "report.md").read_text()


def test_the_report_names_the_incident_without_printing_none() -> None:
    from trtspec.bench.report_notes import incident_note

    stub = {
        "kind": "stub_crash",
        "model": "baseline",
        "route": "code",
        "error": "the Python-backend stub of model 'baseline' (pid 7) was killed by SIGKILL",
        "action": "tritonserver restarted on the same ports",
        "requests_failed": 2,
    }
    assert incident_note(stub) == (
        "server incident: baseline (code): the Python-backend stub of model 'baseline' (pid 7) "
        "was killed by SIGKILL — tritonserver restarted on the same ports; 2 request(s) "
        "failed, counted as errors"
    )
    server = {
        **stub,
        "kind": "server_exit",
        "model": None,
        "route": None,
        "error": "tritonserver (pid 9) was killed by SIGKILL",
        "requests_failed": 0,
    }
    assert incident_note(server) == (
        "server incident: tritonserver: tritonserver (pid 9) was killed by SIGKILL — "
        "tritonserver restarted on the same ports; no request failed"
    )
    unknown = {**server, "kind": "stub_crash", "error": "a stub died"}
    assert incident_note(unknown).startswith("server incident: a model not identified: a stub")
    assert "None" not in incident_note(server) + incident_note(unknown)
