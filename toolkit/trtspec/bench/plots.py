"""The PNG plots of a run folder (``plots/``): speedup per cell, speedup vs
concurrency per swept route, throughput vs latency (Pareto), latency
distributions per arm, acceptance by draft position. Written atomically with
matplotlib's Agg backend; the reports reference them by relative path."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Literal

from trtspec.artifacts.bench_run import (
    RequestRow,
    Summary,
)
from trtspec.bench import goodput, positions
from trtspec.bench.records import atomic_write_bytes
from trtspec.bench.report_notes import arm_name
from trtspec.bench.report_tables import sweep_routes

PLOTS_DIR = "plots"


def safe_name(route: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in route)


def sweep_png(route: str) -> str:
    return f"{PLOTS_DIR}/speedup_vs_concurrency_{safe_name(route)}.png"


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
    name = sweep_png(route).split("/", 1)[1]
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
                _save(fig, run_dir, f"pareto_{safe_name(route)}.png"),
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
                _save(fig, run_dir, f"latency_{safe_name(route)}.png"),
            )
        )
        plt.close(fig)
    for route in positions.plot_routes(summary):
        fig = positions.position_plot(plt, summary, route)
        images.append(
            (
                f"{route}: acceptance by draft position",
                _save(fig, run_dir, f"acceptance_by_position_{safe_name(route)}.png"),
            )
        )
        plt.close(fig)
    return images
