"""Rendering a run folder: ``summary.json``, ``routing.yaml``, ``report.md``,
``report.html`` (with PNG plots in ``plots/`` referenced by relative path) and
the console lines, all from ``requests.jsonl`` (+ ``run.json`` and
``metrics.jsonl`` when present). ``render_run`` is what ``trtspec bench``
calls at the end and what ``trtspec report`` calls on a saved (or killed)
run. Every file is written atomically."""

from __future__ import annotations

import html
import io
import json
from pathlib import Path
from typing import Any, Literal

from trtspec.artifacts.bench_run import (
    REQUESTS_FILE,
    RUN_FILE,
    Decision,
    DecisionRules,
    Headline,
    JSONObject,
    Level,
    RequestRow,
    RunInfo,
    Summary,
    load_run_info,
    save_summary,
)
from trtspec.artifacts.routing import ROUTING_YAML
from trtspec.bench import distribution, goodput, positions
from trtspec.bench.decide import K_NOTE, k_table, mean_tps, routing_yaml
from trtspec.bench.records import (
    atomic_write_bytes,
    atomic_write_text,
    read_requests,
)
from trtspec.bench.report_notes import _fmt, arm_name, measurement_notes
from trtspec.bench.summary import build_summary, read_jsonl_loose
from trtspec.catalogue import BASELINE
from trtspec.errors import BenchError

METRICS_FILE = "metrics.jsonl"
PLOTS_DIR = "plots"


def quality_label(dec: Decision, decision: DecisionRules) -> str:
    h = dec["headline"]
    q = h.get("quality_pass_rate")
    if (eq := h.get("equal_rate")) is not None and eq < decision["min_equal_rate"]:
        return "quality differs"
    if any("quality pass" in r for r in dec["reasons"]):
        return "quality fail"
    if q is None:
        return "quality n/a"
    if q >= decision["min_quality_pass_rate"]:
        return "quality pass"
    # below the bar but no worse than the baseline: the target's own quality
    base = h.get("baseline_quality_pass_rate")
    if base is not None and q > base:
        return f"quality {q:.0%}, above baseline {base:.0%}"
    if base is not None and q < base:  # at T > 0, not shown worse (decide.py)
        return f"quality {q:.0%}, baseline {base:.0%}"
    return f"quality {q:.0%} as baseline"


def _pct(v: float) -> str:
    return f"{v * 100:+.0f}%"


def headline_text(h: Headline) -> str:
    """The paired claims of a headline: speedup, tokens/s change and latency
    change, each with its interval (all from one estimate)."""
    sp = h.get("speedup")
    if not sp:
        return "speedup -  tok/s -  latency -"
    tps, lat = h["tokens_per_second_change"], h["latency_change"]
    if tps is None or lat is None:  # both come with the speedup (decide.paired_changes)
        return "speedup -  tok/s -  latency -"
    return (
        f"speedup {sp['point']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]  "
        f"tok/s {_pct(tps['point'])}  latency {_pct(lat['point'])} "
        f"[{_pct(lat['ci_low'])}, {_pct(lat['ci_high'])}]"
    )


def console_lines(summary: Summary) -> list[str]:
    """One line per route and variant (its best k), numbers from the summary.
    Speedup, tokens/s change and latency change all come from the paired
    per-prompt estimate, so they cannot contradict each other."""
    lines = []
    decision = summary["settings"]["decision"]
    for dec in summary["decisions"]:
        if not dec["best_k"]:
            continue
        h = dec["headline"]
        line = (
            f"route={dec['route']}  {dec.get('baseline') or BASELINE} "
            f"{_fmt(h['baseline_tokens_per_second'])} tok/s  "
            f"{arm_name(dec['variant'], dec['num_speculative_tokens'])}  "
            f"{headline_text(h)}  {h.get('pairs', 0)} pairs  "
            f"{quality_label(dec, decision)}{goodput.headline_suffix(h)}  → {dec['decision']}"
        )
        if dec.get("max_concurrency") is not None:
            line += f" up to concurrency {dec['max_concurrency']}"
        else:
            line += _decided_at(dec)
        routed = summary.get("routing", {}).get("routes", {}).get(dec["route"]) or {}
        if routed.get("draft_len_schedule") and routed.get("variant") == dec["variant"]:
            line += f"; routed by load with draft_len_schedule {routed['draft_len_schedule']}"
        if dec["short_output"]:
            line += "  (short outputs)"
        lines.append(line)
        lines += level_lines(dec)
    return lines


def _decided_at(dec: Decision) -> str:
    """When the headline's level (the lowest) did not reach the arm's decision
    itself, name the level that did, so `speedup 1.24x … → exclude` does not
    read as a contradiction."""
    levels = dec.get("levels") or []
    if len(levels) < 2 or levels[0]["decision"] == dec["decision"]:
        return ""
    for lvl in levels[1:]:
        if lvl["decision"] == dec["decision"]:
            return f" (decided at concurrency={lvl['concurrency']})"
    return ""


def level_lines(dec: Decision) -> list[str]:
    """Under a route measured at several concurrency levels, one line per
    level above the headline's (the lowest): that level's own estimate and
    decision, which the arm's decision (and its cap) rests on."""
    levels = dec.get("levels") or []
    if len(levels) < 2:
        return []
    out = []
    for lvl in levels[1:]:
        sp = lvl.get("speedup")
        est = (
            "speedup -"
            if not sp
            else f"speedup {sp['point']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]"
        )
        gd = lvl.get("goodput_difference")
        if gd:
            est += f"  goodput {goodput.describe(gd)}"
        out.append(
            f"    at concurrency={lvl['concurrency']}: {est}  {lvl['pairs']} pairs  "
            f"→ {lvl['decision']} at this load"
        )
    return out


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


def sweep_routes(summary: Summary) -> dict[str, list[int]]:
    """Routes measured at more than one closed-loop concurrency level, with
    their levels (ascending)."""
    levels: dict[str, set[int]] = {}
    for c in summary["cells"]:
        if (conc := c.get("concurrency")) is not None:
            levels.setdefault(c["route"], set()).add(int(conc))
    return {r: sorted(ls) for r, ls in levels.items() if len(ls) > 1}


def _level_text(lvl: Level | None) -> str:
    if lvl is None:
        return "-"
    sp = lvl.get("speedup")
    est = "-" if not sp else f"{sp['point']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]"
    return f"{est} {lvl['decision']} ({lvl['pairs']} pairs)"


def concurrency_table(summary: Summary, route: str) -> tuple[list[str], list[list[str]]]:
    """Speedup vs concurrency for one route: the aggregate tokens/s over all
    arms at each level (lowest temperature; summary.load_throughput), the
    baseline's mean per-request tokens/s and its mean requests in flight (a
    level c counts one arm's requests in flight, the unit of routing.yaml's
    limits), then each arm's paired speedup, per-level decision and the cap
    written to routing.yaml."""
    levels = sweep_routes(summary)[route]
    headers = ["arm", *[f"concurrency={c}" for c in levels], "decision"]
    base = {
        int(conc): c
        for c in summary["cells"]
        if c["route"] == route
        and c["variant"] == BASELINE
        and (conc := c.get("concurrency")) is not None
    }
    together = {
        int(t["concurrency"]): t["tokens_per_second"]
        for t in summary.get("load_throughput") or []
        if t["route"] == route
        and t["temperature"] == min(c["temperature"] for c in summary["cells"])
    }
    rows = [
        ["all arms: aggregate tok/s", *[_fmt(together.get(c), ".1f") for c in levels], ""],
        [
            "baseline tok/s per request",
            *[_fmt(mean_tps(base.get(c)), ".1f") for c in levels],
            "",
        ],
        [
            "baseline requests in flight (mean)",
            *[_fmt(b.get("inflight_mean") if (b := base.get(c)) else None, ".1f") for c in levels],
            "",
        ],
    ]
    for dec in summary["decisions"]:
        if dec["route"] != route or not dec.get("levels"):
            continue
        by = {lvl["concurrency"]: lvl for lvl in dec["levels"]}
        cap = dec.get("max_concurrency")
        rows.append(
            [
                arm_name(dec["variant"], dec["num_speculative_tokens"]),
                *[_level_text(by.get(c)) for c in levels],
                dec["decision"] + (f" up to concurrency {cap}" if cap is not None else ""),
            ]
        )
    return headers, rows


def _cell_rows(summary: Summary) -> list[list[str]]:
    out = []
    for c in summary["cells"]:
        sp = c.get("speedup")
        out.append(
            [
                c["route"],
                arm_name(c["variant"], c.get("num_speculative_tokens")),
                c["load"],
                f"{c['temperature']:g}",
                str(c["count"]),
                str(c.get("pairs") or "-"),
                str(c["errors"]),
                _fmt(c["ttft_ms"]["p50"], ".1f"),
                _fmt(c["ttft_ms"]["p95"], ".1f"),
                _fmt(c["latency_ms"]["p50"], ".1f"),
                _fmt(c["latency_ms"]["p95"], ".1f"),
                _fmt(c["tpot_ms"]["p50"], ".2f"),
                _fmt(c["tokens_per_second"]["mean"], ".1f"),
                _fmt(c.get("acceptance_rate"), ".2f"),
                _fmt(c.get("mean_accepted_length"), ".2f"),
                "-" if not sp else f"{sp['point']:.2f} [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]",
                _fmt(c.get("equal_rate"), ".0%"),
                _fmt(c.get("quality_pass_rate"), ".0%"),
                "yes" if c.get("short_output") else "",
                _fmt(
                    mem / 2**20 if (mem := c.get("server_memory_bytes")) else None,
                    ".0f",
                ),
            ]
        )
    return out


CELL_HEADERS = [
    "route",
    "variant",
    "load",
    "T",
    "n",
    "pairs",
    "err",
    "TTFT p50",
    "TTFT p95",
    "lat p50",
    "lat p95",
    "TPOT p50",
    "tok/s",
    "accept",
    "acc len",
    "speedup [95% CI]",
    "equal@T0",
    "quality",
    "short",
    "mem MiB",
]


def _header_facts(summary: Summary) -> list[tuple[str, str]]:
    spec = summary.get("spec") or {}
    versions = summary.get("versions") or {}
    machine = summary.get("machine") or {}
    totals = summary["totals"]
    return [
        ("run", str(summary.get("run_id"))),
        ("spec", f"{spec.get('name')} ({spec.get('hash')})"),
        ("tool", f"trtspec {summary['tool_version']} @ {summary.get('git_commit')}"),
        ("machine", f"{machine.get('platform')}, {machine.get('cpu_count')} CPUs"),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if v)),
        ("server", json.dumps(summary.get("server"))),
        (
            "requests",
            f"{totals['requests']} measured, {totals['errors']} errors, "
            f"{totals['warmup_requests']} warmup",
        ),
        (
            "complete",
            "yes"
            if summary["complete"]
            else f"no — incomplete: {summary['incomplete_reason']}"
            if summary.get("incomplete_reason")
            else "no (interrupted or still running)",
        ),
        (
            "server memory",
            ", ".join(
                sorted(
                    {
                        _MEMORY_KINDS.get(c.get("server_memory_kind") or "", "-")
                        for c in summary["cells"]
                    }
                )
            ),
        ),
    ]


_MEMORY_KINDS = {
    "gpu": "GPU memory used (Triton metrics)",
    "process_rss": "RSS of the tritonserver process tree",
    "host_used": "host memory in use (Triton metrics, whole machine)",
}


def _md_table(headers: list[str], rows: list[list[str]]) -> str:
    def esc(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _level(summary: Summary) -> str:
    seq = (summary.get("settings") or {}).get("sequential")
    if seq and int(seq.get("looks", 1)) > 1:
        return (
            f"{seq['confidence']:.2%} per look ({seq['looks']} looks, "
            f"alpha {seq['alpha']:g} split over them)"
        )
    return "95%"


_GOODPUT_NOTE = (
    "A request meets the objectives when it succeeded and each bound holds for it "
    "(ITL is its TPOT). share = met / requests; good req/s and tok/s count only those "
    "requests over the cell's span. vs baseline = paired difference in share on the "
    "same prompts (Agresti–Min interval)."
)

_SWEEP_NOTE = (
    "A level c is c requests of one arm in flight: blocks of c prompts go to each arm "
    "in turn (arm order alternating per block), every prompt paired over the arms, "
    "one server. A variant is promoted up to the "
    "largest measured level at which it, and every lower measured level, was a "
    "promote; routing.yaml's max_concurrency holds that cap and the router sends "
    "the route's further requests to the fallback."
)


def render_markdown(summary: Summary, images: list[tuple[str, str]] | None = None) -> str:
    parts = ["# trtspec benchmark report", ""]
    parts += [f"- **{k}**: {v}" for k, v in _header_facts(summary)]
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
        parts += ["## Speedup vs concurrency", "", _SWEEP_NOTE, ""]
        for route in sweeps:
            headers, rows = concurrency_table(summary, route)
            parts += [f"### {route}", "", _md_table(headers, rows), ""]
            parts += [
                f"![{title}]({src})" for title, src in images or [] if src == _sweep_png(route)
            ]
            parts += [""]
    k_headers, k_rows = k_table(summary)
    if k_rows:
        parts += ["## Draft length per load", "", K_NOTE, "", _md_table(k_headers, k_rows), ""]
    good = goodput.table_rows(summary)
    if good:
        goal = goodput.objectives_text(summary["settings"]["decision"].get("objectives"))
        parts += [f"## Goodput under objectives ({goal})", "", _GOODPUT_NOTE, ""]
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
            src = f"{PLOTS_DIR}/acceptance_by_position_{_safe(route)}.png"
            parts += [f"![{t}]({i})" for t, i in images or [] if i == src] + [""]
    parts += [
        "## Per route × variant × load × temperature",
        "",
        _md_table(CELL_HEADERS, _cell_rows(summary)),
        "",
    ]
    parts += [
        "Times in ms. TPOT = (E2E − TTFT)/(completion tokens − 1). Speedup = geometric "
        "mean over paired prompts of baseline/variant ms per output token, with the t "
        f"interval on the log ratios at {_level(summary)}; the decision lines' tok/s and "
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


def render_html(summary: Summary, images: list[tuple[str, str]]) -> str:
    e = html.escape
    facts = "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in _header_facts(summary))
    cells = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in _cell_rows(summary)
    )
    heads = "".join(f"<th>{e(h)}</th>" for h in CELL_HEADERS)
    decs = "".join(
        f"<tr class='{e(d['decision'])}'><td>{e(d['route'])}</td>"
        f"<td>{e(arm_name(d['variant'], d['num_speculative_tokens']))}</td>"
        f"<td>{e(d['decision'])}</td><td>{'yes' if d['best_k'] else ''}</td>"
        f"<td>{'yes' if d['short_output'] else ''}</td><td>{e('; '.join(d['reasons']))}</td></tr>"
        for d in summary["decisions"]
    )
    swept = {_sweep_png(route) for route in sweep_routes(summary)}
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
                if src == _sweep_png(route)
            )
        )
    if sweep:
        sweep = f"<h2>Speedup vs concurrency</h2><p>{e(_SWEEP_NOTE)}</p>{sweep}"
    k_headers, k_rows = k_table(summary)
    if k_rows:
        sweep += f"<h2>Draft length per load</h2><p>{e(K_NOTE)}</p>" + _html_table(
            k_headers, k_rows
        )
    good = goodput.table_rows(summary)
    if good:
        goal = goodput.objectives_text(summary["settings"]["decision"].get("objectives"))
        sweep += (
            f"<h2>Goodput under objectives ({e(goal)})</h2><p>{e(_GOODPUT_NOTE)}</p><table><tr>"
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
        src = f"{PLOTS_DIR}/acceptance_by_position_{_safe(route)}.png"
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


def _safe(route: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in route)


def _sweep_png(route: str) -> str:
    return f"{PLOTS_DIR}/speedup_vs_concurrency_{_safe(route)}.png"


def _sweep_plot(plt: Any, run_dir: Path, summary: Summary, route: str) -> tuple[str, str]:
    """One route's speedup (95% CI bars) against concurrency, one line per arm."""
    levels = sweep_routes(summary)[route]
    fig, ax = plt.subplots(figsize=(6, 4))
    arms = [d for d in summary["decisions"] if d["route"] == route and d.get("levels")]
    for i, dec in enumerate(arms):
        pts = [(lvl["concurrency"], sp) for lvl in dec["levels"] if (sp := lvl.get("speedup"))]
        if not pts:
            continue
        # each arm a little to the side, so overlapping intervals stay legible
        dodge = 1.0 + 0.04 * (i - (len(arms) - 1) / 2)
        xs = [conc * dodge for conc, _ in pts]
        ys = [sp["point"] for _, sp in pts]
        lo = [y - sp["ci_low"] for y, (_, sp) in zip(ys, pts, strict=True)]
        hi = [sp["ci_high"] - y for y, (_, sp) in zip(ys, pts, strict=True)]
        ax.errorbar(
            xs,
            ys,
            yerr=[lo, hi],
            marker="o",
            capsize=4,
            label=arm_name(dec["variant"], dec["num_speculative_tokens"]),
        )
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axhline(
        summary["settings"]["decision"]["min_speedup"], color="green", linestyle=":", linewidth=1
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set_xlabel("concurrency (in-flight requests)")
    ax.set_ylabel("speedup vs baseline (CI)")
    ax.set_title(f"{route}: speedup vs concurrency")
    ax.legend(fontsize=7)
    name = _sweep_png(route).split("/", 1)[1]
    src = _save(fig, run_dir, name)
    plt.close(fig)
    return f"{route}: speedup vs concurrency", src


def _save(fig: Any, run_dir: Path, name: str) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    atomic_write_bytes(run_dir / PLOTS_DIR / name, buf.getvalue())
    return f"{PLOTS_DIR}/{name}"


def write_plots(run_dir: Path, summary: Summary, rows: list[RequestRow]) -> list[tuple[str, str]]:
    """Speedup per route with CI bars, speedup vs concurrency per route
    measured at several levels, TTFT/latency distributions per variant and
    route, and acceptance by draft position per route. Returns (title,
    relative src)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images: list[tuple[str, str]] = []
    cells = summary["cells"]
    sp_cells = [c for c in cells if c.get("speedup")]
    if sp_cells:
        # Horizontal: one row per cell, so long route/variant labels stay legible.
        fig, ax = plt.subplots(figsize=(7, max(2.5, 0.35 * len(sp_cells) + 1)))
        labels = [
            f"{c['route']}  {arm_name(c['variant'], c.get('num_speculative_tokens'))}"
            f"  {c['load']} T={c['temperature']:g}"
            for c in sp_cells
        ]
        intervals = [sp for c in sp_cells if (sp := c.get("speedup"))]
        pts = [sp["point"] for sp in intervals]
        lo = [p - sp["ci_low"] for p, sp in zip(pts, intervals, strict=True)]
        hi = [sp["ci_high"] - p for p, sp in zip(pts, intervals, strict=True)]
        ys = list(range(len(pts)))[::-1]
        ax.errorbar(pts, ys, xerr=[lo, hi], fmt="o", capsize=4)
        ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.axvline(
            summary["settings"]["decision"]["min_speedup"],
            color="green",
            linestyle=":",
            linewidth=1,
        )
        ax.set_yticks(ys, labels, fontsize=7)
        ax.set_xlabel("speedup vs baseline (95% CI)")
        ax.set_title("Speedup per route")
        images.append(("Speedup per route with 95% CI", _save(fig, run_dir, "speedup.png")))
        plt.close(fig)
    images += [_sweep_plot(plt, run_dir, summary, route) for route in sweep_routes(summary)]
    for route in goodput.pareto_routes(summary):
        fig = goodput.pareto_plot(plt, summary, route)
        images.append(
            (
                f"{route}: throughput vs latency",
                _save(fig, run_dir, f"pareto_{_safe(route)}.png"),
            )
        )
        plt.close(fig)
    measured = [r for r in rows if not r.get("warmup") and not r.get("error")]
    for route in dict.fromkeys(r["route"] for r in measured):
        arms: dict[str, list[RequestRow]] = {}
        for r in measured:
            if r["route"] == route:
                arms.setdefault(arm_name(r["variant"], r.get("num_speculative_tokens")), []).append(
                    r
                )
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
        timings: tuple[tuple[Any, Literal["ttft_ms", "latency_ms"], str], ...] = (
            (axes[0], "ttft_ms", "TTFT (ms)"),
            (axes[1], "latency_ms", "end-to-end latency (ms)"),
        )
        for ax, key, title in timings:
            data = [
                [v for r in rs if (v := r.get(key)) is not None] or [0.0] for rs in arms.values()
            ]
            ax.boxplot(data)
            ax.set_xticks(range(1, len(arms) + 1), list(arms), fontsize=7, rotation=20)
            ax.set_title(f"{route}: {title}")
        images.append(
            (
                f"{route}: TTFT and latency per variant",
                _save(fig, run_dir, f"latency_{_safe(route)}.png"),
            )
        )
        plt.close(fig)
    for route in positions.plot_routes(summary):
        fig = positions.position_plot(plt, summary, route)
        images.append(
            (
                f"{route}: acceptance by draft position",
                _save(fig, run_dir, f"acceptance_by_position_{_safe(route)}.png"),
            )
        )
        plt.close(fig)
    return images


def baseline_present(summary: Summary) -> bool:
    return any(c["variant"] == BASELINE for c in summary["cells"])
