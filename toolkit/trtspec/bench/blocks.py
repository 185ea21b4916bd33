"""The order a cell's requests go out in (docs/design/decisions.md, *Load*).

A closed-loop level c is c requests of ONE arm in flight: the unit of the
router's ``max_concurrency`` and ``draft_len_schedule`` (``routing.InFlight``
counts a route's own requests on its variant). A cell's sample indices are cut
into *blocks* of c consecutive samples; each block goes to every arm in turn,
one arm at a time (its c prompts on c streams; the next arm starts when the
last of them has finished), and the arm order reverses every other block
(A B C, C B A, …) so slow drift cancels. Every prompt still goes to every arm:
the pairing is per prompt. Level 1 is the per-prompt ABBA order.

Pair counts at level c are whole blocks, since a partial block would hold
fewer than c in flight: a fixed count or an until-decided cap of N becomes the
largest multiple of c not above N, but at least c (``whole_blocks``), and the
looks of an until-decided plan round up to whole blocks under that cap
(``SequentialPlan.sizes_at``).

Cache state: with c no larger than the route's prompts, the c samples of a
block are c distinct prompts (samples cycle through the prompts in file
order), so no request of a block can find blocks its own arm left for the same
prompt in that block, and every earlier block had finished on every arm before
it: each arm's requests start from the same cache history. With c larger than
the route's prompts a block repeats a prompt, and whether the second copy
finds the first's blocks depends on timing; ``repeats_in_block`` says when,
the run warns, and the summary's ``cache_state_differs`` shows any difference.

An open-loop cell (``--request-rate``) has no level: its requests go out as
one block, interleaved per prompt in ABBA order, at their arrival times."""

from __future__ import annotations

from collections.abc import Sequence

from trtspec.bench.client import Arm

# What a closed-loop level counts (run.json / summary.json settings.level_unit)
LEVEL_UNIT = "requests of one arm in flight"


def whole_blocks(n: int, level: int | None) -> int:
    """The pair count a cell at ``level`` sends for a count or cap of ``n``:
    whole blocks, at most ``n`` but at least one block (open loop: ``n``)."""
    if level is None or level <= 1:
        return n
    return max(level, n // level * level)


def round_up(n: int, level: int | None) -> int:
    """``n`` rounded up to whole blocks of ``level`` (open loop: ``n``)."""
    if level is None or level <= 1:
        return n
    return -(-n // level) * level


def abba(arms: Sequence[Arm], index: int) -> list[Arm]:
    """The arm order of block (or prompt) ``index``: as given, reversed on odd."""
    return list(arms) if index % 2 == 0 else list(reversed(arms))


def cell_order(
    samples: Sequence[int], arms: Sequence[Arm], level: int | None
) -> list[list[tuple[int, Arm]]]:
    """(sample index, arm) in sending order, as blocks that run one after the
    other. ``level`` None: one block, per-sample ABBA interleave. Else the
    samples, in order, cut into runs of ``level``; run j (whose first sample is
    s) goes to every arm in ``abba(arms, s // level)`` order, one block per
    arm. The parity comes from the sample index, so the order of a batch sent
    later continues the order of the ones before it."""
    if level is None:
        return [[(s, arm) for s in samples for arm in abba(arms, s)]]
    if level < 1:
        raise ValueError(f"a closed-loop level is at least 1, got {level}")
    out: list[list[tuple[int, Arm]]] = []
    for start in range(0, len(samples), level):
        run = list(samples[start : start + level])
        for arm in abba(arms, run[0] // level):
            out.append([(s, arm) for s in run])
    return out


def repeats_in_block(prompts: int, level: int | None) -> bool:
    """Whether a block at ``level`` must send one prompt twice (the route has
    fewer prompts than the level)."""
    return level is not None and level > prompts
