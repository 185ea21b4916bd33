"""Rendering a run folder: ``summary.json``, ``routing.yaml``, ``report.md``
and ``report.html`` (with PNG plots in ``plots/`` referenced by relative
path), all from ``requests.jsonl`` (+ ``run.json`` and ``metrics.jsonl`` when
present). One module per output: report_console (the decision lines),
report_md, report_html (sharing report_tables), plots. ``render_run`` is what
``trtspec bench`` calls at the end and what ``trtspec report`` calls on a
saved (or killed) run. Every file is written atomically."""

from __future__ import annotations

from pathlib import Path

from trtspec.artifacts.bench_run import (
    REQUESTS_FILE,
    RUN_FILE,
    JSONObject,
    RequestRow,
    RunInfo,
    Summary,
    load_run_info,
    save_summary,
)
from trtspec.artifacts.routing import ROUTING_YAML
from trtspec.bench.decide import routing_yaml
from trtspec.bench.plots import write_plots
from trtspec.bench.records import atomic_write_text, read_requests
from trtspec.bench.report_html import render_html
from trtspec.bench.report_md import render_markdown
from trtspec.bench.summary import build_summary, read_jsonl_loose
from trtspec.errors import BenchError

METRICS_FILE = "metrics.jsonl"


def _load_run(run_dir: Path) -> tuple[list[RequestRow], RunInfo, list[JSONObject]]:
    if not run_dir.is_dir():
        raise BenchError(
            f"{run_dir}: not a folder", hint="pass a run folder such as results/<run>/"
        )
    rows = read_requests(run_dir / REQUESTS_FILE)
    if not rows:
        raise BenchError(
            f"{run_dir / REQUESTS_FILE}: no completed requests to report",
            hint="the run ended before any request finished; rerun `trtspec bench`",
        )
    return rows, load_run_info(run_dir / RUN_FILE), read_jsonl_loose(run_dir / METRICS_FILE)


def render_run(run_dir: Path, *, plots: bool = True) -> Summary:
    """Recompute and write every artefact of ``run_dir``; return the summary."""
    rows, run_info, memory = _load_run(run_dir)
    summary = build_summary(rows, run_info, memory)
    save_summary(run_dir, summary)
    atomic_write_text(run_dir / ROUTING_YAML, routing_yaml(summary["routing"]))
    images = write_plots(run_dir, summary, rows) if plots else []
    atomic_write_text(run_dir / "report.md", render_markdown(summary, images))
    atomic_write_text(run_dir / "report.html", render_html(summary, images))
    return summary
