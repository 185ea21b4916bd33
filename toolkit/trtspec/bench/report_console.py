"""The console form of a run's results: one decision line per (route,
variant, k) with its headline (speedup, tokens/s and latency change, each
with its interval, from one paired estimate), the quality label and, for a
load sweep, the per-level lines. ``trtspec bench`` prints them at the end and
report.md / report.html quote them."""

from __future__ import annotations

from trtspec.artifacts.bench_run import (
    Decision,
    DecisionRules,
    Headline,
    Summary,
)
from trtspec.bench import goodput
from trtspec.bench.report_notes import _fmt, arm_name
from trtspec.catalogue import BASELINE


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
