"""The measurement notes of a benchmark report (report.md and report.html):
server incidents, client overhead, hidden acceptance, prefix-cache state and
what a closed-loop load level counts. Kept apart from bench/report.py, which
renders them."""

from __future__ import annotations

from typing import Any

from trtspec.artifacts.bench_run import JSONObject, Summary


def arm_name(variant: str, k: Any) -> str:
    """An arm as the report names it: ``variant`` or ``variant(k=K)``."""
    return variant if k is None else f"{variant}(k={k})"


def _fmt(v: float | None, spec: str = ".0f", none: str = "-") -> str:
    return none if v is None else format(v, spec)


def incident_note(incident: JSONObject) -> str:
    """One report line per server incident. The model and route are those of
    the first request it failed; an incident that failed no request (or a
    whole-server exit the watchdog saw first) has neither, and the line says
    so instead of printing ``None``."""
    model = incident.get("model") or (
        "tritonserver" if incident.get("kind") == "server_exit" else "a model not identified"
    )
    where = f" ({incident['route']})" if incident.get("route") else ""
    failed = incident.get("requests_failed", 0)
    effect = f"{failed} request(s) failed, counted as errors" if failed else "no request failed"
    return f"server incident: {model}{where}: {incident['error']} — {incident['action']}; {effect}"


def measurement_notes(summary: Summary) -> list[str]:
    """The report's measurement notes: client overhead, external arms, hidden
    acceptance, incidents, cache state and what a load level counts."""
    from trtspec.bench.external_notes import external_notes

    client = summary.get("client") or {}
    notes = list(client.get("warnings") or []) + external_notes(summary)
    notes += [
        f"{c['route']} {c['variant']} {c['load']}: acceptance {c['acceptance_note']}"
        for c in summary.get("cells") or []
        if c.get("arm_kind", "triton") == "triton"
        and c.get("speculative")
        and c.get("acceptance_source") is None
        and c.get("acceptance_note")
    ]
    notes += [incident_note(i) for i in summary.get("incidents") or []]
    notes += cache_notes(summary)
    notes += level_notes(summary)
    if client.get("overhead_ms_p50") is not None:
        notes.insert(
            0,
            (
                "client CPU time in trtspec code per request p50 "
                f"{client['overhead_ms_p50']:.3f} ms, "
                f"p95 {client['overhead_ms_p95']:.3f} ms (wall p95 "
                f"{_fmt(client.get('overhead_wall_ms_p95'), '.3f')} ms); lag probe p95 "
                f"{_fmt(client.get('lag_ms_p95'), '.2f')} ms, "
                f"max {_fmt(client.get('lag_ms_max'), '.2f')} ms"
            ),
        )
    return notes


def level_notes(summary: Summary) -> list[str]:
    """What a closed-loop level counts (bench/blocks.py), when the run has a
    level above 1, and each route × level whose blocks repeated a prompt."""
    unit = (summary.get("settings") or {}).get("level_unit")
    levels = {int(conc) for c in summary["cells"] if (conc := c.get("concurrency"))}
    notes = []
    if unit and any(level > 1 for level in levels):
        notes.append(
            f"load levels: concurrency=c is c {unit} (each arm in turn sends a block of c "
            "prompts, arm order alternating per block, every prompt paired over the arms): "
            "the unit of routing.yaml's max_concurrency and draft_len_schedule"
        )
    notes += [
        f"{r['route']} {r['load']}: {r['prompts']} prompt(s) for blocks of that level, so "
        "a block sent a prompt twice and its arms may have started from different cache states"
        for r in summary.get("block_repeats") or []
    ]
    return notes + cross_level_notes(summary)


def cross_level_notes(summary: Summary) -> list[str]:
    """Each route whose baseline reused more prompt tokens per request at a
    later closed-loop level than at its first: the later level found blocks
    the earlier one cached (every arm alike, so its pairs stay fair), which
    makes its TTFT, goodput and Pareto point incomparable with the first's."""
    first: dict[tuple[str, float], tuple[int, float]] = {}
    notes = []
    cells = [
        (int(conc), float(reused), c)
        for c in summary["cells"]
        if c.get("variant") == "baseline"
        and (conc := c.get("concurrency"))
        and (reused := c.get("prefix_reused_tokens_mean")) is not None
    ]
    for level, reused, c in sorted(cells, key=lambda lc: lc[0]):
        key = (c["route"], float(c.get("temperature") or 0.0))
        if key not in first:
            first[key] = (level, reused)
        elif reused > first[key][1]:
            notes.append(
                f"{c['route']}: the baseline reused {reused:.0f} prompt tokens per request "
                f"at concurrency={level} against {first[key][1]:.0f} at concurrency="
                f"{first[key][0]}: that level found KV blocks an earlier level cached "
                "(every arm alike), so compare its TTFT, goodput and throughput within "
                "the level, not across levels"
            )
    return notes


def cache_notes(summary: Summary) -> list[str]:
    """What the report says about cache state: the policy, and every cell
    where a prompt's baseline and variant rows started from different
    prefix-cache states (their speedup mixes speculation with cache luck)."""
    parity = summary.get("prefix_cache")
    notes = []
    if parity and parity.get("policy"):
        how = {
            "cold": "no arm reuses another arm's KV blocks for the same prompt",
            "warm": "each measured request follows a 1-token request for the same prompt",
            "off": "arms share whatever engine models the repository shares",
        }
        notes.append(
            f"prefix cache: {parity['policy']} ({how.get(parity['policy'], '')})"
            + ("" if parity.get("enforced", True) else " — not enforced on this server")
            + "".join(
                f"; {arm} served by its own {model}"
                for arm, model in (parity.get("own_engine_models") or {}).items()
            )
        )
    for c in summary["cells"]:
        if c.get("cache_state_differs"):
            arm = arm_name(c["variant"], c.get("num_speculative_tokens"))
            notes.append(
                f"cache state differs: {c['route']} {arm} "
                f"{c['load']} T={c['temperature']:g}: {c['cache_state_differs']} of {c['pairs']} "
                f"prompts had a different prefix_reused_tokens than the baseline "
                f"(samples {c.get('cache_state_differs_samples')})"
            )
    return notes
