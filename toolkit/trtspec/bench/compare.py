"""Comparing two benchmark runs (``trtspec compare RUN_A RUN_B``): per route ×
variant × load × temperature, the change from A to B in acceptance rate, mean
accepted length, speedup (both CIs and whether they overlap), TTFT p50/p95
and quality pass rate, plus what differs between the runs' fingerprints
(trtspec.fingerprint). A variant benched at several k is represented by its
best k (the one its decision picked), so a k=2 run compares with a k=4 run.
``--fail-on`` gates use bench's grammar (trtspec.bench.gates) over the
change metrics in ``METRICS``; a positive value is always "B is worse"."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, TypedDict, TypeVar

from trtspec.artifacts import bench_run
from trtspec.artifacts.bench_run import Cell, Interval, Summary
from trtspec.bench.metrics import BY_NAME as CELL
from trtspec.fingerprint import diff

RowKey = tuple[str, str, str, float]  # route, variant, load, temperature
T = TypeVar("T")

# `trtspec compare` reads each run through summary.json's owner
load_summary = bench_run.load_summary


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _drop(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _increase(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a <= 0 else b / a - 1.0


class Sides(TypedDict, Generic[T]):
    """One figure in run A and in run B (None where that run's cell has none)."""

    a: T | None
    b: T | None


class ComparisonRow(TypedDict):
    """One route × variant × load × temperature present in both runs."""

    route: str
    variant: str
    load: str
    temperature: float
    num_speculative_tokens: Sides[int]
    acceptance_rate: Sides[float]
    mean_accepted_length: Sides[float]
    speedup: Sides[Interval]
    ttft_p50_ms: Sides[float]
    ttft_p95_ms: Sides[float]
    quality_pass_rate: Sides[float]
    speedup_ci_overlap: bool | None
    changes: dict[str, float | None]  # METRICS by name


class Comparison(TypedDict):
    """The whole comparison document (what ``--format json`` prints)."""

    run_a: str | None
    run_b: str | None
    rows: list[ComparisonRow]
    only_in_a: list[str]
    only_in_b: list[str]
    fingerprint_changes: list[str]


def _ab(p: Sides[float]) -> tuple[float | None, float | None]:
    return (
        None if p["a"] is None else float(p["a"]),
        None if p["b"] is None else float(p["b"]),
    )


def _points(p: Sides[Interval]) -> tuple[float | None, float | None]:
    a, b = p["a"], p["b"]
    return (a["point"] if a else None), (b["point"] if b else None)


# change metric -> how to read it from one comparison row (positive = B worse)
METRICS: dict[str, Callable[[ComparisonRow], float | None]] = {
    "acceptance_drop": lambda r: _drop(*_ab(r["acceptance_rate"])),
    "mean_accepted_length_drop": lambda r: _drop(*_ab(r["mean_accepted_length"])),
    "speedup_drop": lambda r: _drop(*_points(r["speedup"])),
    "quality_drop": lambda r: _drop(*_ab(r["quality_pass_rate"])),
    "ttft_p50_increase": lambda r: _increase(*_ab(r["ttft_p50_ms"])),
    "ttft_p95_increase": lambda r: _increase(*_ab(r["ttft_p95_ms"])),
}


def _chosen_cells(summary: Summary) -> dict[RowKey, Cell]:
    """One cell per route × variant × load × temperature: the variant's best k."""
    best = {
        (d["route"], d["variant"]): d.get("num_speculative_tokens")
        for d in summary.get("decisions") or []
        if d.get("best_k")
    }
    out: dict[RowKey, Cell] = {}
    for c in summary["cells"]:
        key = (c["route"], c["variant"], str(c["load"]), float(c["temperature"]))
        k = c.get("num_speculative_tokens")
        if (c["route"], c["variant"]) in best and k != best[(c["route"], c["variant"])]:
            continue
        if key not in out or (k or 0) > (out[key].get("num_speculative_tokens") or 0):
            out[key] = c
    return out


def _pair(a: Cell | None, b: Cell | None, read: Callable[[Cell], T | None]) -> Sides[T]:
    return {"a": read(a) if a else None, "b": read(b) if b else None}


def _overlap(sa: Interval | None, sb: Interval | None) -> bool | None:
    if not sa or not sb:
        return None
    return bool(sa["ci_low"] <= sb["ci_high"] and sb["ci_low"] <= sa["ci_high"])


def compare_summaries(a: Summary, b: Summary) -> Comparison:
    """The whole comparison document (what ``--format json`` prints)."""
    ca, cb = _chosen_cells(a), _chosen_cells(b)
    rows: list[ComparisonRow] = []
    for key in [*ca, *(k for k in cb if k not in ca)]:
        x, y = ca.get(key), cb.get(key)
        if x is None or y is None:
            continue
        speedup = _pair(x, y, lambda c: c.get("speedup"))
        row: ComparisonRow = {
            "route": key[0],
            "variant": key[1],
            "load": key[2],
            "temperature": key[3],
            "num_speculative_tokens": _pair(x, y, lambda c: c.get("num_speculative_tokens")),
            "acceptance_rate": _pair(x, y, CELL["acceptance_rate"].read),
            "mean_accepted_length": _pair(x, y, CELL["mean_accepted_length"].read),
            "speedup": speedup,
            "ttft_p50_ms": _pair(x, y, CELL["ttft_p50_ms"].read),
            "ttft_p95_ms": _pair(x, y, CELL["ttft_p95_ms"].read),
            "quality_pass_rate": _pair(x, y, CELL["quality_pass_rate"].read),
            "speedup_ci_overlap": _overlap(speedup["a"], speedup["b"]),
            "changes": {},
        }
        row["changes"] = {name: read(row) for name, read in METRICS.items()}
        rows.append(row)
    label = {k: f"{k[0]}/{k[1]} {k[2]} T={k[3]:g}" for k in [*ca, *cb]}
    return {
        "run_a": a.get("run_id"),
        "run_b": b.get("run_id"),
        "rows": rows,
        "only_in_a": [label[k] for k in ca if k not in cb],
        "only_in_b": [label[k] for k in cb if k not in ca],
        "fingerprint_changes": diff(a.get("fingerprint"), b.get("fingerprint")),
    }


def gate_cells(comparison: Comparison) -> list[Mapping[str, Any]]:
    """Rows shaped for trtspec.bench.gates.check_gates (metrics at top level)."""
    return [
        {
            **r["changes"],
            "route": r["route"],
            "variant": r["variant"],
            "load": r["load"],
            "temperature": r["temperature"],
            "num_speculative_tokens": r["num_speculative_tokens"]["b"],
        }
        for r in comparison["rows"]
    ]


def _reader(name: str) -> Callable[[Mapping[str, Any]], float | None]:
    return lambda cell: cell.get(name)


# what --fail-on reads from a gate_cells row
GATE_METRICS: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    name: _reader(name) for name in METRICS
}


# -- rendering -----------------------------------------------------------------------------


def _num(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _move(p: Sides[float], spec: str) -> str:
    if p["a"] is None and p["b"] is None:
        return "-"
    return f"{_num(p['a'], spec)}→{_num(p['b'], spec)}"


def _ci(s: Interval | None) -> str:
    return "-" if not s else f"{s['point']:.2f} [{s['ci_low']:.2f}, {s['ci_high']:.2f}]"


TABLE_HEADERS = [
    "route",
    "variant",
    "load",
    "T",
    "k",
    "acceptance",
    "Δ",
    "mean_acc_len",
    "speedup A",
    "speedup B",
    "CIs overlap",
    "ttft_p50_ms",
    "ttft_p95_ms",
    "quality",
]


def table_rows(comparison: Comparison) -> list[list[str]]:
    out = []
    for r in comparison["rows"]:
        k = r["num_speculative_tokens"]
        overlap = r["speedup_ci_overlap"]
        acc = r["acceptance_rate"]
        out.append(
            [
                r["route"],
                r["variant"],
                r["load"],
                f"{r['temperature']:g}",
                "-" if k["a"] is None and k["b"] is None else f"{k['a']}→{k['b']}",
                _move(acc, ".2f"),
                _num(_delta(acc["a"], acc["b"]), "+.2f"),
                _move(r["mean_accepted_length"], ".2f"),
                _ci(r["speedup"]["a"]),
                _ci(r["speedup"]["b"]),
                "-" if overlap is None else ("yes" if overlap else "no"),
                _move(r["ttft_p50_ms"], ".1f"),
                _move(r["ttft_p95_ms"], ".1f"),
                _move(r["quality_pass_rate"], ".0%"),
            ]
        )
    return out


def render_html(comparison: Comparison) -> str:
    """A self-contained page: the table and a plot of both runs' speedups."""
    esc = html.escape
    image = _speedup_plot(comparison)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>trtspec compare {esc(str(comparison['run_a']))} → "
        f"{esc(str(comparison['run_b']))}</title></head><body>",
        f"<h1>Run {esc(str(comparison['run_a']))} → {esc(str(comparison['run_b']))}</h1>",
    ]
    if image:
        parts.append(f"<img alt='speedup A vs B with 95% CI' src='data:image/png;base64,{image}'>")
    parts.append(
        "<table border='1' cellspacing='0' cellpadding='3'><tr>"
        + "".join(f"<th>{esc(h)}</th>" for h in TABLE_HEADERS)
        + "</tr>"
    )
    parts += [
        "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>"
        for row in table_rows(comparison)
    ]
    parts.append("</table>")
    parts.append("<h2>Fingerprint differences</h2><ul>")
    parts += [f"<li>{esc(line)}</li>" for line in comparison["fingerprint_changes"]]
    parts.append("</ul></body></html>\n")
    return "\n".join(parts)


def _speedup_plot(comparison: Comparison) -> str | None:
    rows = [r for r in comparison["rows"] if r["speedup"]["a"] or r["speedup"]["b"]]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, max(2.5, 0.5 * len(rows) + 1)))
    ys = list(range(len(rows)))[::-1]
    arms: tuple[tuple[Literal["a", "b"], float, str], ...] = (
        ("a", 0.15, "tab:blue"),
        ("b", -0.15, "tab:orange"),
    )
    for side, shift, colour in arms:
        pts = [(y + shift, sp) for y, r in zip(ys, rows, strict=True) if (sp := r["speedup"][side])]
        if pts:
            ax.errorbar(
                [s["point"] for _, s in pts],
                [y for y, _ in pts],
                xerr=[
                    [s["point"] - s["ci_low"] for _, s in pts],
                    [s["ci_high"] - s["point"] for _, s in pts],
                ],
                fmt="o",
                capsize=4,
                color=colour,
                label=f"run {side.upper()}",
            )
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(
        ys,
        [f"{r['route']}  {r['variant']}  {r['load']} T={r['temperature']:g}" for r in rows],
        fontsize=7,
    )
    ax.set_xlabel("speedup vs baseline (95% CI)")
    ax.legend(fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")
