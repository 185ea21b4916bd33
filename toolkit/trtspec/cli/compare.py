"""``trtspec compare RUN_A RUN_B``: how each route × variant moved between two
benchmark runs, and what differs between what they measured. A thin wrapper
over ``trtspec.bench.compare``; ``--fail-on`` breaches exit 3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtspec.cli._options import fail_on_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress
from trtspec.errors import GateFailed


def _compare_metrics() -> Any:
    from trtspec.bench.compare import GATE_METRICS

    return GATE_METRICS


@click.command("compare")
@click.argument("run_a", metavar="RUN_A", type=click.Path(path_type=Path))
@click.argument("run_b", metavar="RUN_B", type=click.Path(path_type=Path))
@click.option(
    "--html",
    "html_path",
    type=click.Path(path_type=Path),
    help="Also write a page with the table and a speedup plot here.",
)
@fail_on_option(
    'Exit 3 when B is worse than A, e.g. "acceptance_drop>0.1,speedup_drop>0.2"'
    " (metrics: acceptance_drop, mean_accepted_length_drop, speedup_drop,"
    " quality_drop, ttft_p50_increase, ttft_p95_increase).",
    metrics=_compare_metrics,
)
@format_option
def compare_command(
    run_a: Path, run_b: Path, html_path: Path | None, gates: list[Any], fmt: str
) -> None:
    """Per route × variant change from RUN_A to RUN_B (acceptance, mean
    accepted length, speedup with both CIs, TTFT p50/p95, quality) and the
    differences between the runs' fingerprints."""
    from trtspec.bench.compare import (
        GATE_METRICS,
        TABLE_HEADERS,
        compare_summaries,
        gate_cells,
        load_summary,
        render_html,
        table_rows,
    )
    from trtspec.bench.gates import check_gates
    from trtspec.fsutil import atomic_write_text

    comparison = compare_summaries(load_summary(run_a), load_summary(run_b))
    if fmt == "json":
        emit_json(comparison)
    else:
        emit_table(TABLE_HEADERS, table_rows(comparison))
        for side, cells in (("A", comparison["only_in_a"]), ("B", comparison["only_in_b"])):
            if cells:
                click.echo(f"only in {side}: " + ", ".join(cells))
        changes = comparison["fingerprint_changes"]
        click.echo(
            "fingerprint: "
            + (
                "identical"
                if not changes
                else f"{len(changes)} difference" + ("s" if len(changes) != 1 else "")
            )
        )
        for line in changes:
            click.echo(f"  {line}")
    if html_path is not None:
        atomic_write_text(html_path, render_html(comparison))
        progress(f"compare: {html_path}")
    breaches = check_gates(gates, gate_cells(comparison), GATE_METRICS)
    if breaches:
        raise GateFailed("--fail-on breached:\n  " + "\n  ".join(str(b) for b in breaches))


COMMANDS: list[click.Command] = [compare_command]
