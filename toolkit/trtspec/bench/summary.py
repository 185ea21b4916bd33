"""``summary.json``: per route × variant × load × temperature × k statistics
computed from the rows of ``requests.jsonl`` alone (plus the optional server
memory samples in ``metrics.jsonl`` and the settings in ``run.json``), so a
killed run re-renders and anyone can recompute every number from the rows.
Definitions: TTFT is the client-side time to the first non-empty text delta;
TPOT = (E2E − TTFT)/(completion_tokens − 1) per request; acceptance rate =
Σaccepted/Σdrafted; mean accepted length per round = (Σaccepted + Σrounds)/
Σrounds; speedup is the geometric mean over paired prompts of baseline/variant
ms-per-output-token with the t interval on the log ratios (bench/sequential.py;
at the run's per-look level when it sampled until decided)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, cast

from trtspec import __version__
from trtspec.artifacts.bench_run import (
    SUMMARY_SCHEMA_VERSION,
    Cell,
    ClientCost,
    DecisionRules,
    Environment,
    JSONObject,
    LevelThroughput,
    Objectives,
    RequestRow,
    RunInfo,
    SequentialStop,
    Summary,
)
from trtspec.bench import distribution, goodput, positions, stats
from trtspec.bench.decide import decide
from trtspec.bench.openai_metrics import attach_cell_acceptance
from trtspec.bench.quality import FAIL, PASS, SKIPPED, quality_passed
from trtspec.bench.records import pairs_with
from trtspec.bench.sequential import SequentialPlan, paired_ratio_interval
from trtspec.spec.schema import DEFAULT_DECISION

SHORT_OUTPUT_TOKENS = 20

CellKey = tuple[str, str, Any, str, float]  # route, variant, k, load, temperature


def _same_output(b: RequestRow, v: RequestRow) -> bool:
    """Token ids where both arms have them (Triton), text otherwise (OpenAI)."""
    if b.get("output_ids_hash") and v.get("output_ids_hash"):
        return bool(b["output_ids_hash"] == v["output_ids_hash"])
    return bool(b.get("text_hash") == v.get("text_hash"))


def cell_key(row: RequestRow) -> CellKey:
    return (
        row["route"],
        row["variant"],
        row.get("num_speculative_tokens"),
        str(row.get("load")),
        float(row.get("temperature") or 0.0),
    )


def _ok(row: RequestRow) -> bool:
    return not row.get("error")


def _cost(row: RequestRow) -> float | None:
    """ms per output token: the paired cost the speedup compares."""
    n, lat = row.get("completion_tokens"), row.get("latency_ms")
    if not _ok(row) or not n or lat is None or lat <= 0:
        return None
    return float(lat) / float(n)


Counted = Literal["rounds", "draft_tokens", "accepted_tokens", "completion_tokens"]


def _sum(rows: Iterable[RequestRow], key: Counted) -> int:
    return sum(int(r.get(key) or 0) for r in rows)


def _busy_s(rows: list[RequestRow]) -> float:
    """Seconds during which at least one of ``rows`` was in flight (the union
    of their send-to-end intervals). At a closed-loop level the arms take
    turns in blocks (bench/blocks.py), so an arm's busy time leaves out the
    other arms' blocks between its own."""
    spans = sorted((sent, sent + lat / 1000.0) for sent, lat in _times(rows))
    total, start, end = 0.0, None, None
    for a, b in spans:
        if end is None or a > end:
            if end is not None and start is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None and start is not None:
        total += end - start
    return total


Measured = Literal[
    "completion_tokens",
    "latency_ms",
    "prefix_reused_tokens",
    "client_overhead_ms",
    "client_overhead_wall_ms",
    "send_lag_ms",
]


def _present(rows: Iterable[RequestRow], key: Measured) -> list[float]:
    """``key`` of the rows that have it, as the rows hold it."""
    return [v for r in rows if (v := r.get(key)) is not None]


def _timed(rows: list[RequestRow]) -> list[RequestRow]:
    return [r for r in rows if r.get("send_time_unix") is not None and r.get("latency_ms")]


def _times(rows: list[RequestRow]) -> list[tuple[float, float]]:
    """(send time, latency ms) of the rows that have both (``_timed``)."""
    return [
        (sent, lat)
        for r in rows
        if (sent := r.get("send_time_unix")) is not None and (lat := r.get("latency_ms"))
    ]


def _aggregate_tps(rows: list[RequestRow]) -> float | None:
    """Completion tokens per second of busy time (``_busy_s``)."""
    timed = _timed(rows)
    busy = _busy_s(timed)
    return _sum(timed, "completion_tokens") / busy if busy > 0 else None


def _inflight_mean(rows: list[RequestRow]) -> float | None:
    """Requests in flight on average over the busy time: the level the cell
    actually held (a block drains below its level as its requests finish)."""
    timed = _timed(rows)
    busy = _busy_s(timed)
    return sum(lat for _, lat in _times(timed)) / 1000.0 / busy if busy > 0 else None


def pair_by_sample(
    baseline_rows: list[RequestRow], rows: list[RequestRow]
) -> tuple[list[tuple[RequestRow, RequestRow]], list[Any], list[Any]]:
    """(baseline row, variant row) for every variant row whose prompt sample
    the baseline also answered, matched by ``sample_index`` (never by
    position: the arms' rows need not come in the same order, nor all be
    there), and the sample indices only the baseline or only the variant has.
    Of a sample the baseline answered twice (sent again after an incident),
    its last row is the one paired."""
    by_sample = {r.get("sample_index"): r for r in baseline_rows}
    answered = {r.get("sample_index") for r in rows}
    pairs = [
        (by_sample[r.get("sample_index")], r) for r in rows if r.get("sample_index") in by_sample
    ]

    def order(samples: Iterable[Any]) -> list[Any]:
        return sorted(samples, key=lambda s: (s is None, s if s is not None else 0))

    return pairs, order(set(by_sample) - answered), order(answered - set(by_sample))


def summarize_cell(
    rows: list[RequestRow],
    baseline_rows: list[RequestRow] | None,
    *,
    confidence: float = 0.95,
    objectives: Objectives | None = None,
) -> Cell:
    first = rows[0]
    ok = [r for r in rows if _ok(r)]
    errors = len(rows) - len(ok)
    rounds = _sum(ok, "rounds")
    drafted: int | None = _sum(ok, "draft_tokens")
    accepted: int | None = _sum(ok, "accepted_tokens")
    if (
        ok
        and first.get("arm_kind", "triton") == "triton"
        and all(r.get("draft_tokens") is None for r in ok)
    ):
        # a served variant that reports no counts (LLM-API flow): unknown, never 0
        drafted = accepted = None
    completions = _present(ok, "completion_tokens")
    median_completion = stats.percentile(completions, 50)
    qualities = [quality_passed(r.get("quality")) for r in ok]
    judged = [q for q in qualities if q is not None]
    per_check: dict[str, dict[str, int]] = defaultdict(lambda: {PASS: 0, FAIL: 0, SKIPPED: 0})
    for r in ok:
        for name, res in (r.get("quality") or {}).items():
            per_check[name][res.get("status", SKIPPED)] += 1
    speculative = bool(first.get("speculative"))
    sources = {r.get("acceptance_source") for r in ok}
    source = next(iter(sources)) if len(sources) == 1 else None
    notes = [r["acceptance_note"] for r in ok if r.get("acceptance_note")]
    tps = stats.distribution([r.get("tokens_per_second") for r in ok])
    cell: Cell = {
        "route": first["route"],
        "variant": first["variant"],
        "model": first.get("model"),
        "mode": first.get("mode"),
        "speculative": speculative,
        "draft_model": first.get("draft_model"),
        "num_speculative_tokens": first.get("num_speculative_tokens"),
        "arm_kind": first.get("arm_kind", "triton"),
        "pairs_with": pairs_with(first),
        "acceptance_source": source if speculative else None,
        "acceptance_note": (notes[-1] if notes and speculative and source is None else None),
        "load": str(first.get("load")),
        "concurrency": first.get("concurrency"),
        "request_rate": first.get("request_rate"),
        "temperature": float(first.get("temperature") or 0.0),
        "count": len(rows),
        "errors": errors,
        "error_rate": stats.rate(errors, len(rows)),
        # errors the infrastructure caused (stub crash, server restart): in
        # ``errors`` too, told apart so a decision never excludes for them
        "incidents": sum(1 for r in rows if r.get("incident")),
        "ttft_ms": stats.distribution([r.get("ttft_ms") for r in ok]),
        "latency_ms": stats.distribution([r.get("latency_ms") for r in ok]),
        "tpot_ms": stats.distribution([r.get("tpot_ms") for r in ok]),
        "tokens_per_second": {
            "p50": tps["p50"],
            "mean": tps["mean"],
            "aggregate": _aggregate_tps(ok),
        },
        "inflight_mean": _inflight_mean(ok),
        "prompt_tokens_mean": (
            sum(r.get("prompt_tokens") or 0 for r in ok) / len(ok) if ok else None
        ),
        "completion_tokens_median": median_completion,
        "short_output": median_completion is not None and median_completion < SHORT_OUTPUT_TOKENS,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "rounds": rounds,
        "acceptance_rate": stats.rate(accepted or 0, drafted or 0) if speculative else None,
        "mean_accepted_length": (
            ((accepted + rounds) / rounds)
            if speculative and rounds and accepted is not None
            else None
        ),
        "fallbacks": sum(1 for r in ok if r.get("fallback")),
        "quality_pass_rate": stats.rate(sum(1 for q in judged if q), len(judged)),
        "quality_judged": len(judged),
        "quality": {k: dict(v) for k, v in sorted(per_check.items())},
        "speedup": None,
        "pairs": 0,
        "unpaired": None,
        "unpaired_samples": None,
        "equal_rate": None,
        "p95_latency_regression": None,
        "baseline_quality_pass_rate": None,
        "server_memory_bytes": None,
        "prefix_reused_tokens_mean": _mean_reused(ok),
        "cache_state_differs": None,
        "position_acceptance": positions.cell_positions(rows) if speculative else None,
        "goodput": goodput.cell_goodput(rows, objectives),
        "goodput_difference": None,
        "distribution_test": None,
        "quality_difference": None,
    }
    if baseline_rows is not None:
        pairs, baseline_only, variant_only = pair_by_sample(baseline_rows, rows)
        # prompts one arm answered and the other did not (a cell that stopped
        # earlier, a lost row): left out of every paired figure, and said so
        cell["unpaired"] = len(baseline_only) + len(variant_only)
        cell["unpaired_samples"] = {
            "baseline_only": baseline_only[:20],
            "variant_only": variant_only[:20],
        }
        costs = [(_cost(b), _cost(v)) for b, v in pairs]
        usable = [(b, v) for b, v in costs if b is not None and v is not None]
        est = paired_ratio_interval([b for b, _ in usable], [v for _, v in usable], confidence)
        cell["speedup"] = est.as_dict() if est else None
        cell["pairs"] = len(usable)
        cell["goodput_difference"] = goodput.paired_share_difference(pairs, objectives, confidence)
        # Prompts whose two rows started from different cache states: the
        # speedup of those pairs mixes speculation with cache luck.
        differs = [
            r.get("sample_index")
            for b, r in pairs
            if _ok(b)
            and _ok(r)
            and b.get("prefix_reused_tokens") is not None
            and r.get("prefix_reused_tokens") is not None
            and b["prefix_reused_tokens"] != r["prefix_reused_tokens"]
        ]
        cell["cache_state_differs"] = len(differs)
        cell["cache_state_differs_samples"] = differs[:20]
        if cell["temperature"] > 0.0:
            cell["distribution_test"] = distribution.first_token_test(pairs)
            # sampled outputs differ per arm: a gap in quality is judged as a
            # paired difference, not against the baseline's rate as a point
            judged_pairs = [
                (quality_passed(b.get("quality")), quality_passed(v.get("quality")))
                for b, v in pairs
                if _ok(b) and _ok(v)
            ]
            cell["quality_difference"] = stats.paired_proportion_difference(
                [(bq, vq) for bq, vq in judged_pairs if bq is not None and vq is not None],
                confidence,
            )
        if cell["temperature"] == 0.0:
            both_ok = [(b, v) for b, v in pairs if _ok(b) and _ok(v)]
            equal = sum(1 for b, v in both_ok if _same_output(b, v))
            cell["equal_rate"] = stats.rate(equal, len(both_ok))
        base_ok = [r for r in baseline_rows if _ok(r)]
        base_p95 = stats.percentile(_present(base_ok, "latency_ms"), 95)
        var_p95 = cell["latency_ms"]["p95"]
        if base_p95 and var_p95 is not None:
            cell["p95_latency_regression"] = var_p95 / base_p95 - 1.0
        base_judged = [
            q for q in (quality_passed(r.get("quality")) for r in base_ok) if q is not None
        ]
        cell["baseline_quality_pass_rate"] = stats.rate(
            sum(1 for q in base_judged if q), len(base_judged)
        )
    return cell


def _mean_reused(rows: list[RequestRow]) -> float | None:
    vals = _present(rows, "prefix_reused_tokens")
    return sum(vals) / len(vals) if vals else None


def summarize_rows(
    rows: list[RequestRow],
    *,
    confidence: float = 0.95,
    objectives: Objectives | None = None,
) -> list[Cell]:
    """All cells, in the order their first row appears (measured rows only)."""
    groups: dict[CellKey, list[RequestRow]] = {}
    for row in rows:
        if row.get("warmup"):
            continue
        groups.setdefault(cell_key(row), []).append(row)
    cells = []
    for key, group in groups.items():
        route, _variant, _k, load, temp = key
        pair = pairs_with(group[0])
        base = None if pair is None else groups.get((route, pair, None, load, temp))
        cells.append(summarize_cell(group, base, confidence=confidence, objectives=objectives))
    # route, load and variant in order of first appearance; Triton arms before
    # external ones, baselines first in each block
    order = {
        name: {v: i for i, v in enumerate(dict.fromkeys(k[n] for k in groups))}
        for n, name in enumerate(("route", "variant", "k", "load"))
    }

    def position(c: Cell) -> tuple[Any, ...]:
        k = c.get("num_speculative_tokens")
        return (
            order["route"][c["route"]],
            order["load"][c["load"]],
            c["temperature"],
            c["arm_kind"] == "openai",
            c["pairs_with"] is not None,
            order["variant"][c["variant"]],
            -1 if k is None else int(k),
        )

    return sorted(cells, key=position)


def load_throughput(rows: list[RequestRow]) -> list[LevelThroughput]:
    """Per route × closed-loop level × temperature, the completion tokens/s
    of every arm's measured requests together over the time any was in
    flight. The arms take turns in blocks of the level (bench/blocks.py), so
    this is the throughput one arm's blocks reach, averaged over the arms:
    how much batching gains as the level rises."""
    groups: dict[tuple[str, int, float], list[RequestRow]] = {}
    for r in rows:
        conc = r.get("concurrency")
        if r.get("warmup") or not _ok(r) or conc is None:
            continue
        key = (r["route"], int(conc), float(r.get("temperature") or 0.0))
        groups.setdefault(key, []).append(r)
    return [
        {
            "route": route,
            "concurrency": conc,
            "temperature": temp,
            "requests": len(group),
            "tokens_per_second": _aggregate_tps(group),
        }
        for (route, conc, temp), group in groups.items()
    ]


def attach_memory(cells: list[Cell], samples: list[JSONObject]) -> None:
    """Server memory per cell: the largest sample taken while the cell's
    route/load/temperature block ran on a server serving that variant."""
    for cell in cells:
        vals = [
            s["bytes"]
            for s in samples
            if s.get("route") == cell["route"]
            and str(s.get("load")) == cell["load"]
            and float(s.get("temperature") or 0) == cell["temperature"]
            and cell["variant"] in (s.get("variants") or [cell["variant"]])
            and s.get("bytes") is not None
        ]
        kinds = {s.get("kind") for s in samples if s.get("route") == cell["route"]}
        cell["server_memory_bytes"] = max(vals) if vals else None
        cell["server_memory_kind"] = next(iter(kinds)) if len(kinds) == 1 else None


def attach_stops(cells: list[Cell], stops: list[SequentialStop]) -> None:
    """Where a run that sampled until decided stopped each cell: ``stop`` =
    faster | slower | undecided (at the cap or interrupted), after
    ``pairs_sent`` pairs; absent on fixed-count runs."""
    for cell in cells:
        for st in stops:
            if (
                st.get("route"),
                st.get("variant"),
                st.get("num_speculative_tokens"),
                str(st.get("load")),
                float(st.get("temperature") or 0.0),
            ) == (
                cell["route"],
                cell["variant"],
                cell.get("num_speculative_tokens"),
                cell["load"],
                cell["temperature"],
            ):
                cell["stop"] = st.get("verdict")
                cell["pairs_sent"] = st.get("pairs_sent")


def read_jsonl_loose(path: Path) -> list[JSONObject]:
    """Rows of an auxiliary JSONL file; unreadable lines are skipped because
    these files only add detail (memory samples) to what the rows say."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def git_commit(start: Path | None = None) -> str | None:
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=start or Path.cwd(),
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def environment_info() -> Environment:
    """Machine and library versions for the report header."""
    mem = None
    with contextlib.suppress(ValueError, OSError, AttributeError):
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "machine": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpu_count": os.cpu_count(),
            "memory_bytes": mem,
        },
        "versions": {
            "trtspec": __version__,
            "python": platform.python_version(),
            "torch": _version("torch"),
            "transformers": _version("transformers"),
            "tritonclient": _version("tritonclient"),
            "tensorrt_llm": _version("tensorrt_llm"),
        },
    }


def build_summary(
    rows: list[RequestRow],
    run_info: RunInfo,
    memory_samples: list[JSONObject] | None = None,
) -> Summary:
    """The whole ``summary.json`` document (decisions included)."""
    settings = run_info.get("settings") or {}
    decision = cast(DecisionRules, {**DEFAULT_DECISION, **(settings.get("decision") or {})})
    plan = SequentialPlan.from_dict(settings.get("sequential"))
    cells = summarize_rows(
        rows,
        confidence=plan.confidence if plan else 0.95,
        objectives=decision.get("objectives"),
    )
    samples = memory_samples or []
    attach_memory(cells, [s for s in samples if "spec_decode" not in s])
    attach_cell_acceptance(cells, [s for s in samples if "spec_decode" in s])
    attach_stops(cells, run_info.get("sequential_stops") or [])
    measured = [r for r in rows if not r.get("warmup")]
    failed = sum(1 for r in measured if not _ok(r))
    decisions, routing = decide(cells, decision, rollout=settings.get("rollout") or {})
    if run_info.get("fingerprint"):
        # what the decisions were measured on; `trtspec repo --routing` checks it
        routing["fingerprint"] = run_info["fingerprint"]
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "tool": "trtspec",
        "tool_version": __version__,
        "run_id": run_info.get("run_id"),
        "git_commit": run_info.get("git_commit"),
        "spec": run_info.get("spec"),
        "machine": run_info.get("machine"),
        "versions": run_info.get("versions"),
        "server": run_info.get("server"),
        "external": run_info.get("external") or {},
        "prefix_cache": run_info.get("prefix_cache"),
        "started": run_info.get("started"),
        "finished": run_info.get("finished"),
        "complete": bool(run_info.get("complete")),
        "incomplete_reason": run_info.get("incomplete_reason"),
        "settings": {**settings, "decision": decision},
        "totals": {
            "requests": len(measured),
            "errors": failed,
            "error_rate": stats.rate(failed, len(measured)),
            "incidents": sum(1 for r in measured if r.get("incident")),
            "warmup_requests": len(rows) - len(measured),
        },
        "client": client_summary(measured, run_info.get("client") or {}),
        # Stub crashes and server restarts: every request one of them failed is
        # an error row (``incident`` set) in the counts above, then sent again.
        "incidents": run_info.get("incidents") or [],
        "fingerprint": run_info.get("fingerprint"),
        "cells": cells,
        "load_throughput": load_throughput(rows),
        # routes × levels with fewer prompts than the level (bench/blocks.py)
        "block_repeats": run_info.get("block_repeats") or [],
        "decisions": decisions,
        "routing": routing,
    }


LAG_WARN_MS = 5.0
OVERHEAD_WARN_FRACTION = 0.02
SEND_LAG_WARN_MS = 10.0


def client_summary(rows: list[RequestRow], probe: dict[str, float | None]) -> ClientCost:
    """The client's own cost (from the rows) and its lag probe (from
    ``run.json``), with warnings where either could distort the numbers."""
    overhead = _present(rows, "client_overhead_ms")
    overhead_wall = _present(rows, "client_overhead_wall_ms")
    send_lag = _present(rows, "send_lag_ms")
    out: ClientCost = {
        "overhead_ms_p50": stats.percentile(overhead, 50),
        "overhead_ms_p95": stats.percentile(overhead, 95),
        "overhead_wall_ms_p95": stats.percentile(overhead_wall, 95),
        "send_lag_ms_p95": stats.percentile(send_lag, 95),
        "lag_ms_p50": probe.get("lag_ms_p50"),
        "lag_ms_p95": probe.get("lag_ms_p95"),
        "lag_ms_max": probe.get("lag_ms_max"),
        "warnings": [],
    }
    warnings: list[str] = out["warnings"]
    lag95 = probe.get("lag_ms_p95")
    if lag95 is not None and lag95 > LAG_WARN_MS:
        warnings.append(
            f"client threads woke {lag95:.1f} ms late (p95 of a 10 ms sleep): the "
            "client machine is CPU-starved, so client-side times may be inflated"
        )
    # Our own CPU time as a share of the interval it could distort: each
    # request's end-to-end latency (a streamed request pays client cost for
    # every delta, spread over the whole request, not only before TTFT).
    shares = [
        cost / lat
        for r in rows
        if (cost := r.get("client_overhead_ms")) is not None and (lat := r.get("latency_ms"))
    ]
    out["overhead_share_p95"] = stats.percentile(shares, 95)
    share95 = out["overhead_share_p95"]
    if share95 is not None and share95 > OVERHEAD_WARN_FRACTION:
        warnings.append(
            f"client CPU time is {share95:.1%} of a request's latency (p95), more "
            f"than {OVERHEAD_WARN_FRACTION:.0%}: client cost is a visible share "
            "of the timings"
        )
    late = [v for v in send_lag if v > SEND_LAG_WARN_MS]
    if send_lag and len(late) > 0.01 * len(send_lag):
        warnings.append(
            f"{len(late)} of {len(send_lag)} open-loop sends were more than "
            f"{SEND_LAG_WARN_MS:.0f} ms behind the Poisson schedule: the client "
            "could not sustain the requested rate"
        )
    return out
