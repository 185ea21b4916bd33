"""The tables and facts every written report shares (report.md and
report.html render the same rows): the run's header facts, the per-cell
detail table, the speedup-by-concurrency table of a load sweep, and the notes
that explain them. Pure functions of a ``Summary``."""

from __future__ import annotations

import json

from trtspec.artifacts.bench_run import (
    Level,
    Summary,
)
from trtspec.bench.decide import mean_tps
from trtspec.bench.report_notes import _fmt, arm_name
from trtspec.catalogue import BASELINE


def sweep_routes(summary: Summary) -> dict[str, list[int]]:
    """Routes measured at more than one closed-loop concurrency level, with
    their levels (ascending)."""
    levels: dict[str, set[int]] = {}
    for c in summary["cells"]:
        if (conc := c.get("concurrency")) is not None:
            levels.setdefault(c["route"], set()).add(int(conc))
    return {r: sorted(ls) for r, ls in levels.items() if len(ls) > 1}


def level_text(lvl: Level | None) -> str:
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
                *[level_text(by.get(c)) for c in levels],
                dec["decision"] + (f" up to concurrency {cap}" if cap is not None else ""),
            ]
        )
    return headers, rows


def cell_rows(summary: Summary) -> list[list[str]]:
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


def header_facts(summary: Summary) -> list[tuple[str, str]]:
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


def measured_at(summary: Summary) -> str:
    seq = (summary.get("settings") or {}).get("sequential")
    if seq and int(seq.get("looks", 1)) > 1:
        return (
            f"{seq['confidence']:.2%} per look ({seq['looks']} looks, "
            f"alpha {seq['alpha']:g} split over them)"
        )
    return "95%"


GOODPUT_NOTE = (
    "A request meets the objectives when it succeeded and each bound holds for it "
    "(ITL is its TPOT). share = met / requests; good req/s and tok/s count only those "
    "requests over the cell's span. vs baseline = paired difference in share on the "
    "same prompts (Agresti–Min interval)."
)


SWEEP_NOTE = (
    "A level c is c requests of one arm in flight: blocks of c prompts go to each arm "
    "in turn (arm order alternating per block), every prompt paired over the arms, "
    "one server. A variant is promoted up to the "
    "largest measured level at which it, and every lower measured level, was a "
    "promote; routing.yaml's max_concurrency holds that cap and the router sends "
    "the route's further requests to the fallback."
)


def baseline_present(summary: Summary) -> bool:
    return any(c["variant"] == BASELINE for c in summary["cells"])
