"""``report.md``: the run's report as Markdown (header facts, decisions,
load sweep, draft length per load, goodput, T > 0 tests, acceptance by
position, the cell table and the measurement notes), with the PNG plots
referenced by relative path."""

from __future__ import annotations

from trtspec.artifacts.bench_run import (
    Summary,
)
from trtspec.bench import distribution, goodput, positions
from trtspec.bench.decide import K_NOTE, k_table, routing_yaml
from trtspec.bench.plots import PLOTS_DIR, safe_name, sweep_png
from trtspec.bench.report_console import console_lines
from trtspec.bench.report_notes import arm_name, measurement_notes
from trtspec.bench.report_tables import (
    CELL_HEADERS,
    GOODPUT_NOTE,
    SWEEP_NOTE,
    cell_rows,
    concurrency_table,
    header_facts,
    measured_at,
    sweep_routes,
)


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(summary: Summary, images: list[tuple[str, str]] | None = None) -> str:
    parts = ["# trtspec benchmark report", ""]
    parts += [f"- **{k}**: {v}" for k, v in header_facts(summary)]
    parts += ["", "## Decisions", "", "```", *console_lines(summary), "```", ""]
    dec_rows = [
        [
            d["route"],
            arm_name(d["variant"], d["num_speculative_tokens"]),
            d["decision"],
            "yes" if d["best_k"] else "",
            "yes" if d["short_output"] else "",
            "; ".join(d["reasons"]),
        ]
        for d in summary["decisions"]
    ]
    parts += [_md_table(["route", "variant", "decision", "best k", "short", "why"], dec_rows), ""]
    sweeps = sweep_routes(summary)
    if sweeps:
        parts += ["## Speedup vs concurrency", "", SWEEP_NOTE, ""]
        for route in sweeps:
            headers, rows = concurrency_table(summary, route)
            parts += [f"### {route}", "", _md_table(headers, rows), ""]
            parts += [
                f"![{title}]({src})" for title, src in images or [] if src == sweep_png(route)
            ]
            parts += [""]
    k_headers, k_rows = k_table(summary)
    if k_rows:
        parts += ["## Draft length per load", "", K_NOTE, "", _md_table(k_headers, k_rows), ""]
    good = goodput.table_rows(summary)
    if good:
        goal = goodput.objectives_text(summary["settings"]["decision"].get("objectives"))
        parts += [f"## Goodput under objectives ({goal})", "", GOODPUT_NOTE, ""]
        parts += [_md_table(goodput.TABLE_HEADERS, good), ""]
    sampled = distribution.table_rows(summary)
    if sampled:
        parts += ["## At temperature > 0", "", distribution.NOTE, ""]
        parts += [_md_table(distribution.TABLE_HEADERS, sampled), ""]
    pareto = [(t, src) for t, src in images or [] if src.startswith(f"{PLOTS_DIR}/pareto_")]
    if pareto:
        parts += ["## Throughput vs latency", "", *[f"![{t}]({src})" for t, src in pareto], ""]
    pos_routes = list(dict.fromkeys(c["route"] for c in summary["cells"] if c.get("speculative")))
    if pos_routes:
        parts += ["## Acceptance by draft position", "", positions.NOTE, ""]
        for route in pos_routes:
            headers, rows = positions.table(summary, route)
            parts += [f"### {route}", "", _md_table(headers, rows), ""]
            src = f"{PLOTS_DIR}/acceptance_by_position_{safe_name(route)}.png"
            parts += [f"![{t}]({i})" for t, i in images or [] if i == src] + [""]
    parts += [
        "## Per route × variant × load × temperature",
        "",
        _md_table(CELL_HEADERS, cell_rows(summary)),
        "",
    ]
    parts += [
        "Times in ms. TPOT = (E2E − TTFT)/(completion tokens − 1). Speedup = geometric "
        "mean over paired prompts of baseline/variant ms per output token, with the t "
        f"interval on the log ratios at {measured_at(summary)}; the decision lines' tok/s and "
        "latency changes are S − 1 and 1/S − 1 of that same estimate (unpaired p50/p95 "
        "are in this table only). n = measured requests of the arm; pairs = prompts "
        "paired with the baseline. acc len = (accepted + rounds)/rounds.",
        "",
    ]
    parts += ["## Routing", "", "```yaml", routing_yaml(summary["routing"]).rstrip(), "```", ""]
    notes = measurement_notes(summary)
    if notes:
        parts += ["## Measurement notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(parts)
