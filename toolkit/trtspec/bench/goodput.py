"""Goodput: what a serving team counts under latency objectives. A request
*meets* the spec's ``decision.objectives`` when it succeeded and each set bound
holds for it — TTFT ≤ ``ttft_ms``, inter-token latency (its TPOT: (E2E −
TTFT)/(tokens − 1)) ≤ ``itl_ms``, end-to-end latency ≤ ``latency_ms``. Per cell:
the share of requests that meet them, and the requests/s and completion
tokens/s of those requests over the cell's span (the goodput proper). Per
variant cell, the paired difference in share against the baseline on the same
prompts, with the Agresti–Min interval for paired proportions (a Wald interval
on the 2×2 table with ½ added to each cell: it stays honest at small n and
when every pair agrees, where a plain t interval collapses to a point).

With ``decision.decide_by: goodput`` that difference replaces the speedup as
the speed criterion of a decision (bench/decide.py): promote when its interval
lies above 0 (the variant meets the objectives more often than the baseline),
exclude when it lies below. Without objectives nothing here is computed."""

from __future__ import annotations

from typing import Any, Literal

from trtspec.artifacts.bench_run import (
    Cell,
    Change,
    Goodput,
    Headline,
    Objectives,
    PairedDifference,
    RequestRow,
    Summary,
)
from trtspec.bench import stats

OBJECTIVE_FIELDS: dict[str, Literal["ttft_ms", "tpot_ms", "latency_ms"]] = {
    "ttft_ms": "ttft_ms",
    "itl_ms": "tpot_ms",
    "latency_ms": "latency_ms",
}


def active(objectives: Objectives | None) -> dict[str, float]:
    """The bounds that are set, by objective name."""
    return {k: float(v) for k, v in (objectives or {}).items() if k in OBJECTIVE_FIELDS and v}


def meets(row: RequestRow, bounds: dict[str, float]) -> bool:
    """Whether one request met every bound (a failed request never does; a
    bound whose measure the row lacks, e.g. ITL of a one-token answer, holds)."""
    if row.get("error"):
        return False
    for name, bound in bounds.items():
        value = row.get(OBJECTIVE_FIELDS[name])
        if value is not None and float(value) > bound:
            return False
    return True


def _span(rows: list[RequestRow]) -> float | None:
    timed = [
        (sent, sent + lat / 1000.0)
        for r in rows
        if (sent := r.get("send_time_unix")) is not None and (lat := r.get("latency_ms"))
    ]
    if not timed:
        return None
    start = min(a for a, _ in timed)
    end = max(b for _, b in timed)
    return end - start if end > start else None


def cell_goodput(rows: list[RequestRow], objectives: Objectives | None) -> Goodput | None:
    """Share meeting the objectives and the goodput of one cell's rows."""
    bounds = active(objectives)
    if not bounds or not rows:
        return None
    good = [r for r in rows if meets(r, bounds)]
    span = _span([r for r in rows if not r.get("error")])
    tokens = sum(int(r.get("completion_tokens") or 0) for r in good)
    return {
        "objectives": bounds,
        "requests": len(rows),
        "met": len(good),
        "share": len(good) / len(rows),
        "requests_per_second": len(good) / span if span else None,
        "tokens_per_second": tokens / span if span else None,
    }


def paired_share_difference(
    pairs: list[tuple[RequestRow, RequestRow]],
    objectives: Objectives | None,
    confidence: float = 0.95,
) -> PairedDifference | None:
    """Variant share − baseline share over paired prompts, with its interval."""
    bounds = active(objectives)
    if not bounds or not pairs:
        return None
    return stats.paired_proportion_difference(
        [(meets(base, bounds), meets(var, bounds)) for base, var in pairs], confidence
    )


def describe(diff: Change) -> str:
    """``+20% [+3%, +37%]`` (percentage points of requests meeting the objectives)."""

    def pp(v: float) -> str:
        return f"{v * 100:+.0f}%"

    return f"{pp(diff['point'])} [{pp(diff['ci_low'])}, {pp(diff['ci_high'])}]"


def objectives_text(objectives: Objectives | None) -> str:
    """``TTFT ≤ 200 ms, ITL ≤ 50 ms`` for the objectives that are set."""
    names = {"ttft_ms": "TTFT", "itl_ms": "ITL", "latency_ms": "E2E"}
    return ", ".join(f"{names[k]} ≤ {v:g} ms" for k, v in active(objectives).items())


def headline_suffix(h: Headline) -> str:
    """The console line's goodput claim: the arm's share meeting the
    objectives, the baseline's, and the paired difference."""
    g, base, diff = h.get("goodput"), h.get("baseline_goodput"), h.get("goodput_difference")
    if not g:
        return ""
    text = f"  goodput {g['share']:.0%}"
    if base:
        text += f" vs {base['share']:.0%}"
    if diff:
        text += f" ({describe(diff)})"
    return text


TABLE_HEADERS = [
    "route",
    "variant",
    "load",
    "T",
    "met",
    "share",
    "good req/s",
    "good tok/s",
    "vs baseline [CI]",
]


def table_rows(summary: Summary) -> list[list[str]]:
    """One row per cell that has goodput (runs with objectives)."""
    rows = []
    for c in summary["cells"]:
        g = c.get("goodput")
        if not g:
            continue
        k = c.get("num_speculative_tokens")
        diff = c.get("goodput_difference")
        rows.append(
            [
                c["route"],
                c["variant"] if k is None else f"{c['variant']}(k={k})",
                c["load"],
                f"{c['temperature']:g}",
                f"{g['met']}/{g['requests']}",
                f"{g['share']:.0%}",
                "-" if g["requests_per_second"] is None else f"{g['requests_per_second']:.2f}",
                "-" if g["tokens_per_second"] is None else f"{g['tokens_per_second']:.1f}",
                describe(diff) if diff else "-",
            ]
        )
    return rows


def pareto_routes(summary: Summary) -> list[str]:
    """Routes worth a throughput-vs-latency plot: measured at several
    closed-loop levels, or judged under objectives."""
    levels: dict[str, set[Any]] = {}
    for c in summary["cells"]:
        levels.setdefault(c["route"], set()).add(c.get("concurrency"))
    has_goal = bool(active((summary.get("settings") or {}).get("decision", {}).get("objectives")))
    return [r for r, lv in levels.items() if len(lv) > 1 or has_goal]


def pareto_plot(plt: Any, summary: Summary, route: str) -> Any:
    """One route's arms as throughput (tokens/s of the arm's requests) against
    p95 end-to-end latency, one line per arm through its load levels (labelled
    by concurrency); the latency objective, when set, as a line. Up and to the
    left is better; a point another arm beats on both axes is dominated."""
    fig, ax = plt.subplots(figsize=(6, 4))
    arms: dict[str, list[Cell]] = {}
    for c in summary["cells"]:
        if c["route"] == route and c["temperature"] == min(
            x["temperature"] for x in summary["cells"] if x["route"] == route
        ):
            k = c.get("num_speculative_tokens")
            arms.setdefault(c["variant"] if k is None else f"{c['variant']}(k={k})", []).append(c)
    for label, cells in arms.items():
        pts = sorted(
            (
                (tps, p95, c["load"])
                for c in cells
                if (tps := c["tokens_per_second"].get("aggregate"))
                and (p95 := c["latency_ms"]["p95"])
            ),
            key=lambda p: p[0],
        )
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        for x, y, load in pts:
            ax.annotate(load, (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    goal = active((summary.get("settings") or {}).get("decision", {}).get("objectives"))
    if "latency_ms" in goal:
        ax.axhline(goal["latency_ms"], color="red", linestyle=":", linewidth=1, label="E2E goal")
    ax.set_xlabel("tokens/s (the arm's requests, aggregate)")
    ax.set_ylabel("end-to-end latency p95 (ms)")
    ax.set_title(f"{route}: throughput vs latency")
    ax.legend(fontsize=7)
    return fig
