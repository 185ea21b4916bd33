"""The typed shapes of a run folder's files (trtspec.artifacts.bench_run,
trtspec.artifacts.routing) against what bench really writes: every key a
written cell, decision, summary, routing entry or request row carries is
declared, and every required key is there, so a reader typed against them
reads what is on disk. Also the loaders' errors for a broken run.json."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from tests.unit.test_bench_summary import run_rows

from trtspec.artifacts import bench_run
from trtspec.artifacts.routing import Evidence, RouteEntry, RoutingDocument
from trtspec.bench.client import Arm, Job, Outcome
from trtspec.bench.recorder import Recorder
from trtspec.bench.records import RequestLog
from trtspec.bench.routes import RouteSet
from trtspec.bench.summary import build_summary
from trtspec.errors import BenchError


def _keys_fit(obj: dict, typed: type, where: str) -> None:
    declared = set(typed.__annotations__)
    # the modules' annotations are strings (from __future__ import annotations),
    # so NotRequired[...] is read from the text, not __required_keys__
    required = {
        k
        for k, v in typed.__annotations__.items()
        if typed.__total__ and not getattr(v, "__forward_arg__", str(v)).startswith("NotRequired[")
    }
    assert set(obj) <= declared, f"{where}: undeclared keys {sorted(set(obj) - declared)}"
    assert required <= set(obj), f"{where}: missing keys {sorted(required - set(obj))}"


def _summary() -> bench_run.Summary:
    rows = run_rows()
    # a sampled cell too: distribution test, paired quality difference
    for r in [dict(r) for r in rows if not r.get("warmup")]:
        rows.append({**r, "temperature": 0.7})
    run_info: bench_run.RunInfo = {
        "run_id": "r1",
        "settings": {"decision": {"objectives": {"ttft_ms": 50.0}}},
        "sequential_stops": [],
    }
    return build_summary(rows, run_info)


def test_a_written_summary_has_exactly_the_typed_keys() -> None:
    summary = _summary()
    _keys_fit(summary, bench_run.Summary, "summary")
    _keys_fit(summary["totals"], bench_run.Totals, "totals")
    _keys_fit(summary["client"], bench_run.ClientCost, "client")
    assert {c["temperature"] for c in summary["cells"]} == {0.0, 0.7}
    for cell in summary["cells"]:
        where = f"cell {cell['variant']} T={cell['temperature']}"
        _keys_fit(cell, bench_run.Cell, where)
        _keys_fit(cell["latency_ms"], bench_run.Distribution, where)
        _keys_fit(cell["tokens_per_second"], bench_run.Throughput, where)
        if cell["goodput"]:
            _keys_fit(cell["goodput"], bench_run.Goodput, where)
        if cell["speedup"]:
            _keys_fit(cell["speedup"], bench_run.Interval, where)
        for name in ("goodput_difference", "quality_difference"):
            if cell[name]:
                _keys_fit(cell[name], bench_run.PairedDifference, where)
    speculative = [c for c in summary["cells"] if c["pairs_with"] is not None]
    assert speculative and all(c["speedup"] for c in speculative)
    assert any(c["goodput_difference"] for c in speculative)
    for dec in summary["decisions"]:
        _keys_fit(dec, bench_run.Decision, "decision")
        _keys_fit(dec["headline"], bench_run.Headline, "headline")
        for lvl in dec["levels"]:
            _keys_fit(lvl, bench_run.Level, "level")
    routing = summary["routing"]
    _keys_fit(routing, RoutingDocument, "routing")
    promoted = [e for e in routing["routes"].values() if e.get("decision") == "promote"]
    assert promoted, routing
    for entry in routing["routes"].values():
        _keys_fit(entry, RouteEntry, "route entry")
    _keys_fit(promoted[0]["evidence"], Evidence, "evidence")


def test_a_recorded_request_row_has_exactly_the_typed_keys(tmp_path: Path) -> None:
    route = RouteSet("code", tmp_path / "p.jsonl", [{"prompt": "x"}], 8)
    arm = Arm("fast", "fast_model", "ngram", True, k=4)
    job = Job(
        "code",
        0,
        0,
        {"prompt": "x"},
        "x",
        8,
        arm,
        0.0,
        1.0,
        0,
        7,
        "concurrency=1",
        1,
        None,
        False,
        "req-1",
    )
    out = Outcome(job, send_ns=1, send_time_unix=1.0, first_text_ns=2, end_ns=5_000_001)
    out.text, out.ids, out.responses = "abc", [1, 2, 3], 3
    out.final = {"completion_tokens": 3, "draft_tokens": 4, "accepted_tokens": 2, "rounds": 1}
    with RequestLog(tmp_path / "requests.jsonl") as log:
        recorder = Recorder(log, "r1", {"code": route}, threading.Event())
        row = recorder.row(out, 1)
        recorder.close()
    _keys_fit(row, bench_run.RequestRow, "request row")
    assert set(row) == set(bench_run.RequestRow.__annotations__)


def test_a_broken_run_json_names_the_file_and_the_fix(tmp_path: Path) -> None:
    assert bench_run.load_run_info(tmp_path / "run.json") == {}
    (tmp_path / "run.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(BenchError) as err:
        bench_run.load_run_info(tmp_path / "run.json")
    assert err.value.message.startswith(f"{tmp_path / 'run.json'}: not valid JSON (")
    assert "requests.jsonl alone" in (err.value.hint or "")
