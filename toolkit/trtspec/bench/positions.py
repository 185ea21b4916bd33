"""Acceptance by draft position: for position j = 1, 2, …, k, the share of
rounds that drafted a token at j whose token at j was accepted. Where it falls
off along the draft tells which k to use, per route (a falling curve past
position 3 says a longer draft only adds rejected tokens).

Sources, per row: ``drafted_per_position`` / ``accepted_per_position`` from
the orchestrator's final response (draft-loop modes: it counts every round,
speculate.position_counts), or from an external server's per-position
acceptance counters (vLLM: ``…_num_accepted_tokens_per_pos``), where every
verification step drafted k tokens, so position j was drafted once per round.
Modes that draft inside the engine (Medusa, EAGLE, lookahead on the C++
backend) report only totals: their cells have no curve and the report says
so instead of estimating one."""

from __future__ import annotations

from typing import Any

from trtspec.artifacts.bench_run import PositionRate, RequestRow, Summary

NOTE = (
    "Per draft position j: accepted / drafted over the cell's rounds that drafted a token "
    "at j. Where the rate falls off along the draft says which k to use."
)


def _row_counts(row: RequestRow) -> tuple[dict[int, int], dict[int, int]] | None:
    accepted = row.get("accepted_per_position")
    if not accepted:
        return None
    acc = {int(p): int(n) for p, n in accepted.items()}
    drafted = row.get("drafted_per_position")
    if drafted:
        return {int(p): int(n) for p, n in drafted.items()}, acc
    k, rounds = row.get("num_speculative_tokens"), row.get("rounds")
    if k is None or not rounds:
        return None
    return {p: int(rounds) for p in range(1, int(k) + 1)}, acc


def cell_positions(rows: list[RequestRow]) -> list[PositionRate] | None:
    """The cell's curve over its successful rows; ``None`` when no row
    reported per-position counts."""
    drafted: dict[int, int] = {}
    accepted: dict[int, int] = {}
    seen = False
    for row in rows:
        if row.get("error"):
            continue
        counts = _row_counts(row)
        if counts is None:
            continue
        seen = True
        for p, n in counts[0].items():
            drafted[p] = drafted.get(p, 0) + n
        for p, n in counts[1].items():
            accepted[p] = accepted.get(p, 0) + n
    if not seen:
        return None
    return [
        {
            "position": p,
            "drafted": drafted[p],
            "accepted": accepted.get(p, 0),
            "rate": accepted.get(p, 0) / drafted[p] if drafted[p] else None,
        }
        for p in sorted(drafted)
    ]


def unreported(summary: Summary, route: str) -> list[str]:
    """Speculative arms of a route whose runtime reported no per-position counts."""
    names = []
    for c in summary["cells"]:
        if c["route"] == route and c.get("speculative") and not c.get("position_acceptance"):
            k = c.get("num_speculative_tokens")
            name = c["variant"] if k is None else f"{c['variant']}(k={k})"
            if name not in names:
                names.append(name)
    return names


def plot_routes(summary: Summary) -> list[str]:
    return list(dict.fromkeys(c["route"] for c in summary["cells"] if c.get("position_acceptance")))


def position_plot(plt: Any, summary: Summary, route: str) -> Any:
    """One route: acceptance rate against draft position, one line per arm
    (its lowest load and temperature), integer positions on the axis."""
    fig, ax = plt.subplots(figsize=(6, 4))
    shown: set[str] = set()
    width = 1
    for c in summary["cells"]:
        curve = c.get("position_acceptance")
        if c["route"] != route or not curve:
            continue
        k = c.get("num_speculative_tokens")
        name = c["variant"] if k is None else f"{c['variant']}(k={k})"
        if name in shown:  # headline cell only: the first in summary order
            continue
        shown.add(name)
        pts = [(pt["position"], pt["rate"]) for pt in curve if pt["rate"] is not None]
        width = max(width, *(p for p, _ in pts)) if pts else width
        ax.plot([p for p, _ in pts], [r for _, r in pts], marker="o", label=name)
    ax.set_xticks(range(1, width + 1))
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate at this position")
    ax.set_ylim(0, 1.05)
    missing = unreported(summary, route)
    title = f"{route}: acceptance by draft position"
    if missing:
        title += "\n(no per-position counts: " + ", ".join(missing) + ")"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return fig


def table(summary: Summary, route: str) -> tuple[list[str], list[list[str]]]:
    """One route's curves as a table: a row per speculative cell (arm, load,
    temperature), a column per draft position, each entry the rate with its
    accepted/drafted counts; arms that reported no counts say so."""
    cells = [c for c in summary["cells"] if c["route"] == route and c.get("speculative")]
    width = max(
        (pt["position"] for c in cells for pt in c.get("position_acceptance") or []), default=1
    )
    headers = ["arm", "load", "T", *[f"pos {p}" for p in range(1, width + 1)]]
    rows = []
    for c in cells:
        k = c.get("num_speculative_tokens")
        head = [c["variant"] if k is None else f"{c['variant']}(k={k})", c["load"]]
        head.append(f"{c['temperature']:g}")
        curve = {pt["position"]: pt for pt in c.get("position_acceptance") or []}
        if not curve:
            rows.append([*head, "not reported by this runtime", *[""] * (width - 1)])
            continue
        rows.append(
            [
                *head,
                *[
                    "-"
                    if p not in curve or curve[p]["rate"] is None
                    else f"{curve[p]['rate']:.2f} ({curve[p]['accepted']}/{curve[p]['drafted']})"
                    for p in range(1, width + 1)
                ],
            ]
        )
    return headers, rows
