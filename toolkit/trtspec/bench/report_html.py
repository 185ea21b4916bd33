"""``report.html``: the same report as report.md as one HTML page (tables
from bench/report_tables.py, plots referenced by relative path)."""

from __future__ import annotations

import html

from trtspec.artifacts.bench_run import (
    Summary,
)
from trtspec.bench import distribution, goodput, positions
from trtspec.bench.decide import K_NOTE, k_table
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
    sweep_routes,
)


def render_html(summary: Summary, images: list[tuple[str, str]]) -> str:
    e = html.escape
    facts = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in header_facts(summary))
    cells = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in cell_rows(summary)
    )
    heads = "".join(f"<th>{e(h)}</th>" for h in CELL_HEADERS)
    decs = "".join(
        f"<tr class='{e(d['decision'])}'><td>{e(d['route'])}</td>"
        f"<td>{e(arm_name(d['variant'], d['num_speculative_tokens']))}</td>"
        f"<td>{e(d['decision'])}</td><td>{'yes' if d['best_k'] else ''}</td>"
        f"<td>{'yes' if d['short_output'] else ''}</td><td>{e('; '.join(d['reasons']))}</td></tr>"
        for d in summary["decisions"]
    )
    swept = {sweep_png(route) for route in sweep_routes(summary)}
    notes = "".join(f"<li>{e(n)}</li>" for n in measurement_notes(summary))
    console = e("\n".join(console_lines(summary)))
    sweep = ""
    for route in sweep_routes(summary):
        headers, rows = concurrency_table(summary, route)
        sweep += (
            f"<h3>{e(route)}</h3><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in headers)
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
            + "</table>"
            + "".join(
                f"<figure><img src='{e(src)}' alt='{e(title)}'>"
                f"<figcaption>{e(title)}</figcaption></figure>"
                for title, src in images
                if src == sweep_png(route)
            )
        )
    if sweep:
        sweep = f"<h2>Speedup vs concurrency</h2><p>{e(SWEEP_NOTE)}</p>{sweep}"
    k_headers, k_rows = k_table(summary)
    if k_rows:
        sweep += f"<h2>Draft length per load</h2><p>{e(K_NOTE)}</p>" + _html_table(
            k_headers, k_rows
        )
    good = goodput.table_rows(summary)
    if good:
        goal = goodput.objectives_text(summary["settings"]["decision"].get("objectives"))
        sweep += (
            f"<h2>Goodput under objectives ({e(goal)})</h2><p>{e(GOODPUT_NOTE)}</p><table><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in goodput.TABLE_HEADERS)
            + "</tr>"
            + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in good)
            + "</table>"
        )
    sampled = distribution.table_rows(summary)
    if sampled:
        sweep += f"<h2>At temperature &gt; 0</h2><p>{e(distribution.NOTE)}</p>" + _html_table(
            distribution.TABLE_HEADERS, sampled
        )
    pareto = [(t, i) for t, i in images if i.startswith(f"{PLOTS_DIR}/pareto_")]
    if pareto:
        sweep += "<h2>Throughput vs latency</h2>" + "".join(
            f"<figure><img src='{e(i)}' alt='{e(t)}'><figcaption>{e(t)}</figcaption></figure>"
            for t, i in pareto
        )
    shown: set[str] = {i for _, i in pareto}
    pos_html = ""
    for route in dict.fromkeys(c["route"] for c in summary["cells"] if c.get("speculative")):
        src = f"{PLOTS_DIR}/acceptance_by_position_{safe_name(route)}.png"
        shown.add(src)
        pos_html += f"<h3>{e(route)}</h3>" + _html_table(*positions.table(summary, route))
        pos_html += "".join(
            f"<figure><img src='{e(i)}' alt='{e(t)}'><figcaption>{e(t)}</figcaption></figure>"
            for t, i in images
            if i == src
        )
    if pos_html:
        sweep += f"<h2>Acceptance by draft position</h2><p>{e(positions.NOTE)}</p>{pos_html}"
    imgs = "".join(
        f"<figure><img src='{e(src)}' alt='{e(title)}'><figcaption>{e(title)}</figcaption></figure>"
        for title, src in images
        if src not in swept and src not in shown  # shown beside their tables
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>trtspec benchmark report</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: left; }}
tr.promote td {{ background: #e6f4ea; }} tr.exclude td {{ background: #fce8e6; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 640px; }}
</style></head><body>
<h1>trtspec benchmark report</h1>
<table>{facts}</table>
<h2>Decisions</h2>
<pre>{console}</pre>
<table><tr><th>route</th><th>variant</th><th>decision</th><th>best k</th><th>short</th>
<th>why</th></tr>{decs}</table>
{sweep}
<h2>Per route × variant × load × temperature</h2>
<table><tr>{heads}</tr>{cells}</table>
<h2>Plots</h2>
{imgs or "<p>No plots.</p>"}
<h2>Measurement notes</h2>
<ul>{notes or "<li>none</li>"}</ul>
</body></html>
"""


def _html_table(headers: list[str], rows: list[list[str]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
