"""The benchmark's send loop for one route × load × temperature block when it
samples until decided (bench/sequential.py): pairs go out in batches (every
arm still undecided plus the baseline, in the order of bench/blocks.py), and after each
batch every undecided variant arm is looked at; an arm whose interval clears
``min_speedup`` or falls below 1.0 stops, the rest go on until the cap. Costs
come straight from the outcomes (ms per output token, as in summary.py), so
the look needs no file; ``summary.json`` recomputes the same numbers from the
rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trtspec.artifacts.bench_run import Interval, SequentialStop
from trtspec.bench.client import Arm, Outcome
from trtspec.bench.sequential import UNDECIDED, SequentialPlan, look, next_size


def outcome_cost(out: Outcome) -> float | None:
    """ms per output token of a successful request, else None."""
    if out.error or not out.end_ns:
        return None
    n = out.final.get("completion_tokens")
    n = len(out.ids) if n is None else n
    latency_ms = (out.end_ns - out.send_ns) / 1e6
    return latency_ms / n if n and latency_ms > 0 else None


@dataclass
class Block:
    """Costs seen so far in one block, by arm label and sample index."""

    costs: dict[str, dict[int, float | None]] = field(default_factory=dict)

    def record(self, out: Outcome) -> None:
        if out.job.warmup:
            return
        self.costs.setdefault(out.job.arm.label, {})[out.job.sample_index] = outcome_cost(out)

    def paired(
        self, base: Arm, arm: Arm, samples: range
    ) -> tuple[list[float | None], list[float | None]]:
        b, v = self.costs.get(base.label, {}), self.costs.get(arm.label, {})
        keys = [s for s in samples if s in b and s in v]
        return [b[s] for s in keys], [v[s] for s in keys]


@dataclass
class Stop:
    """Where one arm of a block stopped and why (kept in run.json)."""

    arm: Arm
    pairs: int
    verdict: str = UNDECIDED
    speedup: Interval | None = None

    def as_dict(self, route: str, load: str, temperature: float) -> SequentialStop:
        return {
            "route": route,
            "variant": self.arm.variant,
            "num_speculative_tokens": self.arm.k,
            "load": load,
            "temperature": temperature,
            "pairs_sent": self.pairs,
            "verdict": self.verdict,
            "speedup": self.speedup,
        }


def run_block(
    plan: SequentialPlan,
    arms: list[Arm],
    min_speedup: float,
    *,
    send: Callable[[list[Arm], range], None],
    block: Block,
    stopped: Callable[[], bool],
    on_batch: Callable[[int, int], None] | None = None,
    level: int | None = None,
) -> list[Stop]:
    """Send batches until every variant arm is decided or the cap is reached,
    looking at ``plan.sizes_at(level)`` (whole blocks of a closed-loop level).
    ``send(arms, samples)`` runs those arms on those sample indices (and
    feeds ``block.record``); ``on_batch(new_pairs, decided)`` reports
    progress. Returns one ``Stop`` per variant arm."""
    base, variants = arms[0], arms[1:]
    stops = {a.label: Stop(a, 0) for a in variants}
    active = list(variants)
    done = 0
    while active and not stopped():
        size = next_size(plan, done, level)
        if size is None:
            break
        send([base, *active], range(done, size))
        if stopped():
            break
        new, done = size - done, size
        still = []
        for arm in active:
            b, v = block.paired(base, arm, range(done))
            got, est = look(plan, b, v, min_speedup)
            stop = stops[arm.label]
            stop.pairs, stop.verdict = done, got
            stop.speedup = est.as_dict() if est else None
            if got == UNDECIDED:
                still.append(arm)
        active = still
        if on_batch is not None:
            on_batch(new, len(variants) - len(active))
    return [stops[a.label] for a in variants]
