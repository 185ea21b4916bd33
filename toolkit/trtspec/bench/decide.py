"""Decisions per route and variant, and ``routing.yaml`` (docs/design/routing.md).
A variant is judged per k across every load × temperature cell:
``exclude`` when any cell shows it slower (speedup CI entirely below 1), with
too many errors, with broken quality, or — at temperature 0 — with output that
differs from the baseline's; ``promote`` when every cell has its speedup CI
above ``min_speedup``, p95 latency within ``max_p95_regression`` and nothing
broken; ``inconclusive`` otherwise. Quality "breaks" when the pass rate is
under ``min_quality_pass_rate`` *and* under the baseline's own pass rate, so a
variant is not blamed for what the target model itself gets wrong.

Load (closed-loop concurrency) is judged level by level, because speculation
that wins on a lone request can lose in a full batch. With more than one
measured level, a variant is promoted up to its **cap**: the largest measured
level L such that it is promoted at every measured level ≤ L. A level above
the cap that is not a promote (slower, or merely undecided) caps it there;
levels between two measured ones count as unknown, so the cap is never above
the largest measured level that won (conservative). ``max_concurrency`` = L
goes into routing.yaml when some measured level above L was not a promote (no
cap when it won at every level). A variant that does not win at the lowest
level is judged over all cells as before. Broken output (errors, quality,
T=0 inequality) at any level excludes it outright: that is a fault, not a
load effect. Open-loop (request-rate) cells must all promote for any
promote."""

from __future__ import annotations

from typing import Any, TypedDict

import yaml

from trtspec.artifacts.bench_run import (
    Cell,
    Change,
    Decision,
    DecisionRules,
    Interval,
    JSONObject,
    Level,
    Summary,
)
from trtspec.artifacts.routing import ROUTING_YAML, Evidence, RouteEntry, RoutingDocument
from trtspec.artifacts.routing import SCHEMA_VERSION as ROUTING_SCHEMA_VERSION
from trtspec.bench import distribution, goodput, stats
from trtspec.bench.records import pairs_with
from trtspec.catalogue import BASELINE, DEFAULT_CANARY_PERCENT

PROMOTE, EXCLUDE, INCONCLUSIVE = "promote", "exclude", "inconclusive"
_RANK = {PROMOTE: 0, INCONCLUSIVE: 1, EXCLUDE: 2}


class PairedChanges(TypedDict):
    """The headline's claims from one paired speedup estimate."""

    speedup: Interval | None
    tokens_per_second_change: Change | None
    latency_change: Change | None


class KPick(TypedDict):
    """The best k at one level, its paired figure and its decision there."""

    k: int
    figure: Change
    decision: str


class KChoice(TypedDict):
    route: str
    variant: str
    by: str
    levels: dict[int, KPick]


def judge_cell(cell: Cell, d: DecisionRules) -> tuple[str, list[str]]:
    """One cell's verdict and the reasons behind it."""
    verdict, reasons, _broken = _judge(cell, d)
    return verdict, reasons


def _judge(cell: Cell, d: DecisionRules) -> tuple[str, list[str], bool]:
    """``judge_cell`` plus whether an exclude is for broken output (errors,
    quality, T=0 inequality) rather than for speed alone."""
    where = f"{cell['load']} T={cell['temperature']:g}"
    broken: list[str] = []
    # Failures the infrastructure caused (stub crash, server restart) count as
    # errors, but never exclude a variant: at worst it stays inconclusive.
    unsure, noted = _incident_reasons(cell, d, where)
    own_rate = stats.rate(
        cell.get("errors", 0) - int(cell.get("incidents") or 0), cell.get("count") or 0
    )
    if (
        (error_rate := cell.get("error_rate")) is not None
        and error_rate > d["max_error_rate"]
        and own_rate is not None
        and own_rate > d["max_error_rate"]
    ):
        broken.append(f"{where}: error rate {cell['error_rate']:.1%} > {d['max_error_rate']:.1%}")
    qpr, base_qpr = cell.get("quality_pass_rate"), cell.get("baseline_quality_pass_rate")
    qd = cell.get("quality_difference") if cell["temperature"] > 0.0 else None
    if (
        qpr is not None
        and qpr < d["min_quality_pass_rate"]
        and (base_qpr is None or qpr < base_qpr)
        and qd is not None
        and qd["ci_high"] >= 0.0
    ):
        # At T > 0 each arm samples its own outputs: a lower rate that the
        # paired interval does not place below the baseline's is not broken,
        # but not shown fine either.
        unsure.append(
            f"{where}: quality {qpr:.0%} vs baseline {base_qpr or 0:.0%}, paired difference "
            f"{goodput.describe(qd)} not shown below 0 at this temperature"
        )
    elif (
        qpr is not None
        and qpr < d["min_quality_pass_rate"]
        and (base_qpr is None or qpr < base_qpr)
    ):
        broken.append(
            f"{where}: quality pass {qpr:.0%} < {d['min_quality_pass_rate']:.0%}"
            + (f" and below baseline {base_qpr:.0%}" if base_qpr is not None else "")
        )
    eq = cell.get("equal_rate")
    if cell["temperature"] == 0.0 and eq is not None and eq < d["min_equal_rate"]:
        broken.append(
            f"{where}: output equals baseline in {eq:.0%} of prompts at T=0 "
            f"(need {d['min_equal_rate']:.0%})"
        )
    dt = cell.get("distribution_test")
    if cell["temperature"] > 0.0 and dt and dt["p_value"] < distribution.ALPHA:
        broken.append(
            f"{where}: first-token distribution differs from the baseline's "
            f"(chi-square {dt['statistic']:.1f}, dof {dt['dof']}, p = {dt['p_value']:.1g})"
        )
    if d.get("decide_by") == "goodput":
        return _judge_by_goodput(cell, d, where, broken, [*unsure, *noted])
    sp = cell.get("speedup")
    if sp is None:
        return (
            (EXCLUDE if broken else INCONCLUSIVE),
            [*broken, *unsure, *noted, f"{where}: no paired baseline"],
            bool(broken),
        )
    min_pairs = int(d.get("min_pairs", 2))
    n_pairs = int(cell.get("pairs") or 0)
    if n_pairs < min_pairs:
        # Too few pairs for any verdict, a broken one included: say what was seen.
        few = f"{where}: only {n_pairs} paired prompts (< min_pairs {min_pairs})"
        return INCONCLUSIVE, [*broken, *unsure, *noted, few], False
    ci = f"{sp['point']:.2f}x [{sp['ci_low']:.2f}, {sp['ci_high']:.2f}]"
    if sp["ci_high"] < 1.0:
        return EXCLUDE, [*broken, f"{where}: slower than baseline, speedup {ci}"], bool(broken)
    if broken:
        return EXCLUDE, broken, True
    reasons = list(unsure)
    reg = cell.get("p95_latency_regression")
    if reg is not None and reg > d["max_p95_regression"]:
        reasons.append(f"{where}: p95 latency +{reg:.0%} > +{d['max_p95_regression']:.0%}")
    if cell["temperature"] == 0.0 and eq is None:
        reasons.append(f"{where}: no successful pairs to compare outputs")
    if sp["ci_low"] <= d["min_speedup"]:
        reasons.append(f"{where}: speedup {ci} not above {d['min_speedup']:.2f}")
    if reasons:
        return INCONCLUSIVE, [*reasons, *noted], False
    return PROMOTE, [f"{where}: speedup {ci}", *noted], False


def _judge_by_goodput(
    cell: Cell, d: DecisionRules, where: str, broken: list[str], unsure: list[str]
) -> tuple[str, list[str], bool]:
    """``_judge`` with the paired goodput-share difference as the speed
    criterion (bench/goodput.py): above 0 promotes, below 0 excludes."""
    gd = cell.get("goodput_difference")
    if gd is None:
        return (
            (EXCLUDE if broken else INCONCLUSIVE),
            [*broken, *unsure, f"{where}: no paired baseline to compare goodput with"],
            bool(broken),
        )
    min_pairs = int(d.get("min_pairs", 2))
    if int(gd["pairs"]) < min_pairs:
        few = f"{where}: only {gd['pairs']} paired prompts (< min_pairs {min_pairs})"
        return INCONCLUSIVE, [*broken, *unsure, few], False
    share = f"share meeting the objectives {goodput.describe(gd)} vs baseline"
    if gd["ci_high"] < 0.0:
        return (
            EXCLUDE,
            [*broken, f"{where}: fewer requests meet the objectives, {share}"],
            bool(broken),
        )
    if broken:
        return EXCLUDE, broken, True
    reasons = list(unsure)
    reg = cell.get("p95_latency_regression")
    if reg is not None and reg > d["max_p95_regression"]:
        reasons.append(f"{where}: p95 latency +{reg:.0%} > +{d['max_p95_regression']:.0%}")
    if cell["temperature"] == 0.0 and cell.get("equal_rate") is None:
        reasons.append(f"{where}: no successful pairs to compare outputs")
    if gd["ci_low"] <= 0.0:
        reasons.append(f"{where}: {share}, not above 0")
    if reasons:
        return INCONCLUSIVE, reasons, False
    return PROMOTE, [f"{where}: {share}"], False


def _incident_reasons(cell: Cell, d: DecisionRules, where: str) -> tuple[list[str], list[str]]:
    """(reasons that keep the cell inconclusive, notes for any verdict) about
    the requests an infrastructure incident failed."""
    n = int(cell.get("incidents") or 0)
    if not n:
        return [], []
    rate = cell.get("error_rate") or 0.0
    what = (
        f"{where}: {n} request(s) failed by a stub crash or server restart, counted as "
        f"errors (error rate {rate:.1%})"
    )
    if rate > d["max_error_rate"]:
        return [f"{what} > {d['max_error_rate']:.1%}: not judged on infrastructure failures"], []
    return [], [what]


def mean_tps(cell: Cell | None) -> float | None:
    """A cell's mean tokens/s (None without the cell or the figure)."""
    tps = cell.get("tokens_per_second") if cell else None
    return tps.get("mean") if tps else None


def _headline(cells: list[Cell]) -> Cell:
    """The cell the console line shows: lowest concurrency (closed loop
    first), lowest temperature."""

    def order(c: Cell) -> tuple[int, float, float]:
        closed = c.get("concurrency") is not None
        return (
            0 if closed else 1,
            float(c.get("concurrency") or c.get("request_rate") or 0),
            c["temperature"],
        )

    return sorted(cells, key=order)[0]


def decide(
    cells: list[Cell], d: DecisionRules, *, rollout: JSONObject | None = None
) -> tuple[list[Decision], RoutingDocument]:
    """Decisions for every (route, variant, k) and the routing table."""
    rollout = rollout or {}
    by_arm: dict[tuple[str, str, Any], list[Cell]] = {}
    for cell in cells:
        if pairs_with(cell) is None:
            continue
        by_arm.setdefault(
            (cell["route"], cell["variant"], cell.get("num_speculative_tokens")), []
        ).append(cell)
    baselines: dict[tuple[str, str | None, str, float], Cell] = {
        (c["route"], c["variant"], c["load"], c["temperature"]): c
        for c in cells
        if pairs_with(c) is None
    }
    decisions: list[Decision] = []
    for (route, variant, k), arm_cells in by_arm.items():
        verdict, reasons, cap, levels = judge_arm(arm_cells, d)
        head = _headline(arm_cells)
        pair = pairs_with(head)
        base = baselines.get((route, pair, head["load"], head["temperature"]))
        # a capped promote is ranked on the loads it is promoted for
        ranked = [c for c in arm_cells if cap is None or (c.get("concurrency") or 0) <= cap]
        speedups = [sp["point"] for c in ranked if (sp := c.get("speedup"))]
        short = bool(base and base.get("short_output")) or bool(head.get("short_output"))
        decisions.append(
            {
                "route": route,
                "variant": variant,
                "num_speculative_tokens": k,
                "decision": verdict,
                "reasons": reasons,
                "short_output": short,
                "baseline": pair,
                "arm_kind": head.get("arm_kind", "triton"),
                "min_speedup_point": min(speedups) if speedups else None,
                "max_concurrency": cap,
                "levels": levels,
                # errors, quality or T=0 inequality somewhere: never switched to
                # at another level (draft_len_schedule)
                "broken_output": any(_judge(c, d)[2] for c in arm_cells),
                # the sampling temperatures this decision holds for (each judged)
                "temperatures": sorted({c["temperature"] for c in arm_cells}),
                "best_k": False,
                "headline": {
                    "load": head["load"],
                    "temperature": head["temperature"],
                    "baseline_tokens_per_second": mean_tps(base),
                    **paired_changes(head.get("speedup")),
                    "pairs": head.get("pairs", 0),
                    "quality_pass_rate": head.get("quality_pass_rate"),
                    "baseline_quality_pass_rate": head.get("baseline_quality_pass_rate"),
                    "equal_rate": head.get("equal_rate"),
                    "goodput": head.get("goodput"),
                    "baseline_goodput": base.get("goodput") if base else None,
                    "goodput_difference": head.get("goodput_difference"),
                },
            }
        )
    # best k per (route, variant): best verdict, then the highest worst-cell speedup
    best: dict[tuple[str, str], Decision] = {}
    for dec in decisions:
        key = (dec["route"], dec["variant"])
        if key not in best or _better(dec, best[key]):
            best[key] = dec
    for dec in best.values():
        dec["best_k"] = True
    return decisions, _routing(decisions, cells, rollout, str(d.get("decide_by") or "speedup"))


def _combine(kinds: list[str]) -> str:
    if EXCLUDE in kinds:
        return EXCLUDE
    return PROMOTE if kinds and all(v == PROMOTE for v in kinds) else INCONCLUSIVE


def judge_arm(
    arm_cells: list[Cell], d: DecisionRules
) -> tuple[str, list[str], int | None, list[Level]]:
    """One arm's verdict over its cells: (decision, reasons, max_concurrency,
    per-level records). See the module docstring for the load rule."""
    judged = [(c, *_judge(c, d)) for c in arm_cells]
    by_level: dict[int, list[tuple[Cell, str]]] = {}
    for c, v, _rs, _b in judged:
        if (level := c.get("concurrency")) is not None:
            by_level.setdefault(int(level), []).append((c, v))
    levels: list[Level] = []
    for conc in sorted(by_level):
        items = by_level[conc]
        with_sp = [sp for c, _ in items if (sp := c.get("speedup"))]
        levels.append(
            {
                "concurrency": conc,
                "decision": _combine([v for _, v in items]),
                # the level's worst temperature
                "speedup": min(with_sp, key=lambda s: s["point"]) if with_sp else None,
                "pairs": min(int(c.get("pairs") or 0) for c, _ in items),
                "goodput_difference": min(
                    (g for c, _ in items if (g := c.get("goodput_difference"))),
                    key=lambda g: g["point"],
                    default=None,
                ),
            }
        )
    overall = _combine([v for _, v, _, _ in judged])
    cap: int | None = None
    for lvl in levels:
        if lvl["decision"] != PROMOTE:
            break
        cap = lvl["concurrency"]
    open_loop_ok = all(v == PROMOTE for c, v, _, _ in judged if c.get("concurrency") is None)
    broken = any(b for *_, b in judged)
    if len(levels) < 2 or cap is None or broken or not open_loop_ok or overall == PROMOTE:
        reasons = [r for _, v, rs, _ in judged for r in rs if overall == PROMOTE or v != PROMOTE]
        return overall, reasons, None, levels
    above = next(lvl for lvl in levels if lvl["concurrency"] > cap)
    reasons = [
        r
        for c, v, rs, _ in judged
        for r in rs
        if (at := c.get("concurrency")) is None or int(at) <= cap or v != PROMOTE
    ]
    reasons.append(
        f"promoted up to concurrency {cap} only: {above['decision']} at "
        f"concurrency={above['concurrency']} (max_concurrency {cap} in routing.yaml)"
    )
    return PROMOTE, reasons, cap, levels


def paired_changes(speedup: Interval | None) -> PairedChanges:
    """Every headline claim from the one paired estimate. The speedup S is the
    geometric mean of per-prompt baseline/variant ms per output token, so the
    variant's tokens/s change is S − 1 and its latency (per output token)
    change is 1/S − 1, each with the interval mapped through the same
    function: their signs agree with S by construction. Unpaired p50/p95
    stay in the detail table, where they belong."""
    if not speedup:
        return {"speedup": None, "tokens_per_second_change": None, "latency_change": None}
    s, lo, hi = speedup["point"], speedup["ci_low"], speedup["ci_high"]
    return {
        "speedup": speedup,
        "tokens_per_second_change": {"point": s - 1.0, "ci_low": lo - 1.0, "ci_high": hi - 1.0},
        "latency_change": {
            "point": 1.0 / s - 1.0,
            "ci_low": 1.0 / hi - 1.0,
            "ci_high": 1.0 / lo - 1.0,
        },
    }


def _merit(dec: Decision) -> tuple[float, float]:
    """Among promotes: the load it serves (uncapped first), then its worst
    speedup on that load."""
    cap = dec.get("max_concurrency")
    return (float("inf") if cap is None else float(cap), dec["min_speedup_point"] or 0.0)


def _better(a: Decision, b: Decision) -> bool:
    ra, rb = _RANK[a["decision"]], _RANK[b["decision"]]
    if ra != rb:
        return ra < rb
    return _merit(a) > _merit(b)


def draft_len_schedule(
    decisions: list[Decision], top: Decision, by: str = "speedup"
) -> dict[int, int] | None:
    """``{in-flight level: draft length}`` for a routed variant measured at
    several k and several levels: at each measured level up to the route's
    cap, the k promoted there with the best paired figure (the speedup, or
    the goodput difference when deciding by goodput). The same form as the
    LLM API's ``draft_len_schedule`` (the largest level ≤ the current count
    applies); ``None`` unless the best k differs between levels and the
    schedule starts at level 1."""
    cap = top.get("max_concurrency")
    best: dict[int, tuple[float, int]] = {}
    promoted: set[tuple[int, int]] = set()  # (level, k)
    for dec in decisions:
        k = dec["num_speculative_tokens"]
        if (dec["route"], dec["variant"]) != (top["route"], top["variant"]) or k is None:
            continue
        if dec.get("broken_output"):
            continue
        for lvl in dec.get("levels") or []:
            level = int(lvl["concurrency"])
            figure = lvl.get("goodput_difference") if by == "goodput" else lvl.get("speedup")
            if lvl["decision"] != PROMOTE or not figure or (cap is not None and level > cap):
                continue
            promoted.add((level, int(k)))
            if level not in best or figure["point"] > best[level][0]:
                best[level] = (float(figure["point"]), int(k))
    if 1 not in best or len({k for _, k in best.values()}) < 2:
        return None
    # Between two measured levels neither k is known to win. Switch to the
    # heavier level's k right after the lighter level when that k was also
    # promoted there (it won at both ends), else only at its own level.
    schedule: dict[int, int] = {}
    previous: int | None = None
    for level, (_, k) in sorted(best.items()):
        if previous is None or schedule[max(schedule)] != k:
            start = level
            if previous is not None and (previous, k) in promoted:
                start = previous + 1
            schedule[start] = k
        previous = level
    return schedule


def scheduled_cap(decisions: list[Decision], top: Decision) -> int | None:
    """The route's max_concurrency when its variant switches k by load: the
    routed k's own cap raised to the largest measured level L such that at
    every measured level up to L some k of the variant (none with broken
    output) was promoted; ``None`` when that covers every measured level. A
    k that wins alone but loses at 4 in flight, where a shorter k wins,
    serves both loads with a draft_len_schedule instead of falling back."""
    cap = top.get("max_concurrency")
    if cap is None:
        return None
    measured: set[int] = set()
    won: set[int] = set()
    for dec in decisions:
        if (dec["route"], dec["variant"]) != (top["route"], top["variant"]):
            continue
        for lvl in dec.get("levels") or []:
            measured.add(int(lvl["concurrency"]))
            if lvl["decision"] == PROMOTE and not dec.get("broken_output"):
                won.add(int(lvl["concurrency"]))
    for level in sorted(measured):
        if level not in won:
            return max(int(cap), max((w for w in won if w < level), default=int(cap)))
    return None


def k_per_level(decisions: list[Decision], by: str = "speedup") -> list[KChoice]:
    """For each routable (route, variant) measured at several k: at each
    measured level, the k with the best paired figure there (the speedup, or
    the goodput difference when deciding by goodput) and that k's decision at
    the level, promoted or not; what routing.yaml took from it is
    ``draft_len_schedule`` (promoted levels only)."""
    arms: dict[tuple[str, str], list[Decision]] = {}
    for dec in decisions:
        if dec["num_speculative_tokens"] is not None and dec.get("arm_kind", "triton") == "triton":
            arms.setdefault((dec["route"], dec["variant"]), []).append(dec)
    out: list[KChoice] = []
    for (route, variant), decs in arms.items():
        if len(decs) < 2:
            continue
        best: dict[int, KPick] = {}
        for dec in decs:
            k = dec["num_speculative_tokens"]
            for lvl in dec.get("levels") or []:
                figure = lvl.get("goodput_difference") if by == "goodput" else lvl.get("speedup")
                if not figure or k is None:
                    continue
                level = int(lvl["concurrency"])
                if level not in best or figure["point"] > best[level]["figure"]["point"]:
                    best[level] = {
                        "k": int(k),
                        "figure": figure,
                        "decision": lvl["decision"],
                    }
        if best:
            out.append({"route": route, "variant": variant, "by": by, "levels": best})
    return out


K_NOTE = (
    "Each level's best draft length among the k measured there, by the paired figure "
    "the decision uses, with that k's decision at the level. routing.yaml gets a "
    "draft_len_schedule {in-flight level: k} when the best promoted k differs between "
    "levels (the router applies it per request by its current in-flight count)."
)


def k_table(summary: Summary) -> tuple[list[str], list[list[str]]]:
    """Draft length per load: at each measured level the best k of each
    variant swept over k (decide.k_per_level), and what routing.yaml took."""
    by = str(summary["settings"]["decision"].get("decide_by") or "speedup")
    found = k_per_level(summary["decisions"], by)
    levels = sorted({lv for f in found for lv in f["levels"]})
    routed = summary["routing"]["routes"]
    rows = []
    for f in found:
        entry = routed.get(f["route"]) or {}
        if entry.get("variant") != f["variant"]:
            took = f"not routed ({entry.get('decision', '-')})"
        elif entry.get("draft_len_schedule"):
            took = f"draft_len_schedule {entry['draft_len_schedule']}"
        else:
            took = f"num_draft_tokens {entry.get('num_draft_tokens')}"
        if entry.get("variant") == f["variant"]:
            cap = entry.get("max_concurrency")
            took += " at every load" if cap is None else f", max_concurrency {cap}"
        cells = []
        for lv in levels:
            b = f["levels"].get(lv)
            if b is None:
                cells.append("-")
                continue
            point = float(b["figure"]["point"])
            fig = f"{point:.2f}x" if by == "speedup" else f"{point * 100:+.0f}%"
            cells.append(f"k={b['k']} ({fig}, {b['decision']})")
        rows.append([f["route"], f["variant"], *cells, took])
    return ["route", "variant", *[f"concurrency={c}" for c in levels], ROUTING_YAML], rows


def _routing(
    decisions: list[Decision],
    cells: list[Cell],
    rollout: JSONObject,
    by: str = "speedup",
) -> RoutingDocument:
    fallback = rollout.get("fallback_variant") or BASELINE
    canary = int(rollout.get("canary_percent", DEFAULT_CANARY_PERCENT))
    routes: dict[str, RouteEntry] = {}
    for route in dict.fromkeys(c["route"] for c in cells):
        # only Triton arms can be routed to; external arms are for comparison
        cands = [
            d
            for d in decisions
            if d["route"] == route and d["best_k"] and d.get("arm_kind", "triton") == "triton"
        ]
        promoted = sorted(
            (d for d in cands if d["decision"] == PROMOTE),
            key=_merit,
            reverse=True,
        )
        if promoted:
            top = promoted[0]
            entry: RouteEntry = {"variant": top["variant"]}
            if top["num_speculative_tokens"] is not None:
                entry["num_draft_tokens"] = int(top["num_speculative_tokens"])
            entry["canary_percent"] = canary
            entry["decision"] = PROMOTE
            entry["fallback_variant"] = fallback
            cap = scheduled_cap(decisions, top)
            if cap is not None:
                # over this many in-flight requests the router sends the route
                # to the fallback (artifacts/routing.py InFlight)
                entry["max_concurrency"] = cap
            schedule = draft_len_schedule(decisions, {**top, "max_concurrency": cap}, by)
            if schedule is not None:
                entry["draft_len_schedule"] = schedule
            entry["evidence"] = _evidence(top)
        else:
            verdict = INCONCLUSIVE if any(d["decision"] == INCONCLUSIVE for d in cands) else EXCLUDE
            entry = {"variant": BASELINE, "decision": verdict}
        routes[route] = entry
    return {"schema_version": ROUTING_SCHEMA_VERSION, "default_variant": BASELINE, "routes": routes}


def _evidence(dec: Decision) -> Evidence:
    """What a promoted entry rests on: the same paired estimate as the
    console line (read by people; the router ignores it)."""
    h = dec["headline"]

    def r(v: float) -> float:
        return round(float(v), 4)

    sp, tps, lat = h["speedup"], h["tokens_per_second_change"], h["latency_change"]
    if sp is None or tps is None or lat is None:
        raise ValueError(f"{dec['route']}: a promoted decision without a paired speedup")
    return {
        "speedup": r(sp["point"]),
        "speedup_ci": [r(sp["ci_low"]), r(sp["ci_high"])],
        "confidence": r(sp.get("confidence", 0.95)),
        "tokens_per_second_change": r(tps["point"]),
        "latency_change": r(lat["point"]),
        "pairs": int(h.get("pairs") or 0),
        "load": h["load"],
        "temperature": h["temperature"],
        "temperatures": dec.get("temperatures", [h["temperature"]]),
    }


def routing_yaml(routing: RoutingDocument) -> str:
    header = (
        "# Written by `trtspec bench`; feed it to `trtspec repo --routing`.\n"
        "# decision: promote | exclude | inconclusive (see report.md for reasons)\n"
    )
    return header + yaml.safe_dump(routing, sort_keys=False, default_flow_style=False)
