"""The order of a cell's requests (bench/blocks.py) without a server: a
closed-loop level c is blocks of c prompts of one arm, arm order alternating
per block, every prompt paired over every arm; level 1 is the per-prompt ABBA
order; counts and looks are whole blocks; ``run_blocks`` holds at most c
requests of one arm in flight and never two arms at once (real worker
threads, a stand-in stream); the busy-time throughput and mean in-flight
count of the summary."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any, ClassVar

import pytest

from trtspec.bench.blocks import cell_order, repeats_in_block, round_up, whole_blocks
from trtspec.bench.client import Arm, Job, Outcome, run_blocks
from trtspec.bench.sequential import SequentialPlan, next_size
from trtspec.bench.summary import _aggregate_tps, _busy_s, _inflight_mean

A, B, C = Arm("baseline", "baseline"), Arm("ngram", "ngram", "ngram", True, None, 4), Arm("x", "x")


def _names(blocks: list[list[tuple[int, Arm]]]) -> list[list[str]]:
    return [[f"{s}{arm.variant[0]}" for s, arm in block] for block in blocks]


def test_level_one_is_the_per_prompt_abba_order() -> None:
    got = cell_order(range(4), [A, B, C], 1)
    assert _names(got) == [
        ["0b"], ["0n"], ["0x"],
        ["1x"], ["1n"], ["1b"],
        ["2b"], ["2n"], ["2x"],
        ["3x"], ["3n"], ["3b"],
    ]  # fmt: skip


def test_a_level_is_blocks_of_one_arm_alternating_per_block() -> None:
    got = cell_order(range(8), [A, B, C], 4)
    assert _names(got) == [
        ["0b", "1b", "2b", "3b"], ["0n", "1n", "2n", "3n"], ["0x", "1x", "2x", "3x"],
        ["4x", "5x", "6x", "7x"], ["4n", "5n", "6n", "7n"], ["4b", "5b", "6b", "7b"],
    ]  # fmt: skip
    # every block is one arm and `level` prompts; every prompt meets every arm once
    assert all(len({arm for _, arm in block}) == 1 and len(block) == 4 for block in got)
    pairs = Counter(s for block in got for s, _ in block)
    assert pairs == {s: 3 for s in range(8)}


def test_a_later_batch_continues_the_alternation() -> None:
    # until decided sends range(done, size): the parity comes from the samples
    whole = cell_order(range(16), [A, B], 8)
    later = cell_order(range(8, 16), [A, B], 8)
    assert later == whole[2:]
    assert _names(later)[0][0] == "8n"


def test_open_loop_is_one_interleaved_block() -> None:
    got = cell_order(range(3), [A, B], None)
    assert _names(got) == [["0b", "0n", "1n", "1b", "2b", "2n"]]


def test_a_partial_run_is_its_own_block_and_levels_start_at_one() -> None:
    # --isolate halves need not be whole blocks
    assert _names(cell_order([3, 4, 5], [A, B], 2)) == [["3n", "4n"], ["3b", "4b"], ["5b"], ["5n"]]
    with pytest.raises(ValueError, match="at least 1"):
        cell_order(range(2), [A], 0)


def test_counts_and_looks_are_whole_blocks() -> None:
    # a count or cap: whole blocks, at most n, at least one block
    assert [whole_blocks(n, 8) for n in (1, 8, 10, 16, 30)] == [8, 8, 8, 16, 24]
    assert whole_blocks(5, 1) == 5 and whole_blocks(5, None) == 5
    assert [round_up(n, 8) for n in (1, 8, 9)] == [8, 8, 16] and round_up(5, None) == 5
    plan = SequentialPlan(first=5, batch=5, maximum=30)
    assert plan.sizes_at(1) == plan.sizes == [5, 10, 15, 20, 25, 30]
    assert plan.sizes_at(None) == plan.sizes
    assert plan.sizes_at(4) == [8, 12, 16, 20, 28]
    assert plan.sizes_at(8) == [8, 16, 24]
    assert plan.sizes_at(32) == [32]
    # the demo's --max-requests 10 at its level 8: one look at one block
    assert SequentialPlan(first=5, batch=5, maximum=10).sizes_at(8) == [8]
    # never more looks than the plan's, whose confidence every look uses
    assert all(len(plan.sizes_at(c)) <= plan.looks for c in range(1, 40))
    assert [next_size(plan, d, 8) for d in (0, 8, 16, 24)] == [8, 16, 24, None]


def test_repeats_in_block_when_the_level_exceeds_the_prompts() -> None:
    assert not repeats_in_block(8, 8) and not repeats_in_block(3, None)
    assert repeats_in_block(3, 4)


class _Stream:
    """A stand-in StreamWorker: each request takes a few ms; records how many
    requests of each arm were in flight at once."""

    lock: ClassVar[threading.Lock] = threading.Lock()
    inflight: ClassVar[Counter[str]] = Counter()
    peaks: ClassVar[list[dict[str, int]]] = []

    def run(self, job: Job, stop: Any) -> Outcome:
        with self.lock:
            self.inflight[job.arm.label] += 1
            self.peaks.append({k: v for k, v in self.inflight.items() if v})
        time.sleep(0.002 + 0.001 * (job.sample_index % 3))
        with self.lock:
            self.inflight[job.arm.label] -= 1
        return Outcome(job, end_ns=1)

    def reconnect(self) -> None:
        pass

    def close(self) -> None:
        pass


def _job(sample: int, arm: Arm) -> Job:
    return Job(
        "r", sample, sample, {}, "p", 4, arm, 0.0, 1.0, 0, 1, "concurrency=3", 3, None, False,
        f"{arm.label}-{sample}",
    )  # fmt: skip


def test_run_blocks_holds_one_arms_level_and_keeps_block_order() -> None:
    order = cell_order(range(9), [A, B, C], 3)
    blocks = [[_job(s, arm) for s, arm in block] for block in order]
    done: list[Outcome] = []
    _Stream.peaks.clear()
    run_blocks(
        "unused",
        blocks,
        workers=3,
        on_done=done.append,
        stop=threading.Event(),
        request_timeout_s=5,
        make_worker=_Stream,
    )
    assert len(done) == 27
    # never two arms at once, never more than the level of one
    assert all(len(p) == 1 for p in _Stream.peaks), _Stream.peaks
    assert max(next(iter(p.values())) for p in _Stream.peaks) == 3
    # completion order follows the blocks: each block's three, then the next's
    finished = [(o.job.arm.label, o.job.sample_index) for o in done]
    for i, block in enumerate(order):
        assert sorted(finished[3 * i : 3 * i + 3], key=str) == sorted(
            [(arm.label, s) for s, arm in block], key=str
        )


def test_run_blocks_stops_between_blocks() -> None:
    stop = threading.Event()
    blocks = [[_job(s, arm) for s, arm in block] for block in cell_order(range(6), [A, B], 2)]
    done: list[Outcome] = []

    def on_done(out: Outcome) -> None:
        done.append(out)
        if len(done) == 2:
            stop.set()

    run_blocks(
        "unused", blocks, workers=2, on_done=on_done, stop=stop, request_timeout_s=5,
        make_worker=_Stream,
    )  # fmt: skip
    assert len(done) == 2


def _row(send: float, latency_s: float, tokens: int) -> dict[str, Any]:
    return {"send_time_unix": send, "latency_ms": latency_s * 1000, "completion_tokens": tokens}


def test_busy_time_leaves_out_the_other_arms_blocks() -> None:
    # an arm's two blocks of two, 1 s each, with another arm's 3 s block between
    rows = [_row(0, 1, 10), _row(0, 0.5, 10), _row(4, 1, 10), _row(4.2, 0.8, 10)]
    assert _busy_s(rows) == pytest.approx(2.0)
    assert _aggregate_tps(rows) == pytest.approx(40 / 2.0)
    assert _inflight_mean(rows) == pytest.approx((1 + 0.5 + 1 + 0.8) / 2.0)
    assert _aggregate_tps([]) is None and _inflight_mean([]) is None


def test_prefix_cache_keeps_one_entry_per_prompt_when_a_request_repeats_it() -> None:
    """A speculative request that repeats a cached prompt stores each round's
    shorter sequence; those add no entry, so its LRU remembers the same
    prompts as an arm that stores once per request (issue 26 item 6)."""
    import torch

    from trtspec.runtime.engine.kv_reuse import PrefixCache, make_cache

    def cache(n: int) -> Any:
        return make_cache([(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))])

    lru = PrefixCache(capacity=3)
    for prompt in ((1, 2, 3, 4, 5, 6), (7, 8, 9, 10, 11, 12), (13, 14, 15, 16, 17, 18)):
        lru.store(list(prompt), cache(6))
    # the second prompt again, in rounds: 3, then 5 tokens, both inside its entry
    lru.store([7, 8, 9], cache(3))
    lru.store([7, 8, 9, 10, 11], cache(5))
    assert len(lru) == 3
    # the first prompt, now the least recent, is still there
    assert [lru.lookup([*p, 0])[0] for p in ([1, 2, 3], [7, 8], [13, 14, 15])] == [3, 2, 3]
    # a longer sequence replaces the entry it extends
    lru.store([7, 8, 9, 10, 11, 12, 99], cache(7))
    assert len(lru) == 3 and lru.lookup([7, 8, 9, 10, 11, 12, 99, 0])[0] == 7


def _run(tmp_path: Any, prompts: int, policy: str = "cold") -> Any:
    from pathlib import Path

    from trtspec.bench.cells import Run
    from trtspec.bench.plan import BenchPlan, BenchSettings
    from trtspec.bench.routes import RouteSet

    items = [{"prompt": f"prompt {i}"} for i in range(prompts)]
    route = RouteSet("r", Path("r.jsonl"), items, 8)
    settings = BenchSettings(concurrency=[4], requests_per_route=10, prefix_cache=policy)
    plan = BenchPlan("s", None, None, [route], [A, B], settings)
    said: list[str] = []
    return Run(plan, tmp_path, "run", said.append), route, said


def test_a_fixed_count_at_a_level_is_whole_blocks_of_one_arm(tmp_path: Any) -> None:
    run, route, _said = _run(tmp_path, prompts=5)
    blocks = run._jobs(route, [A, B], ("concurrency=4", 4, None), 0.0, samples=None, warmup=False)
    # 10 requests at level 4: two blocks of four per arm (8 pairs), arms alternating
    got = [[(j.arm.variant, j.sample_index, j.prompt_index) for j in block] for block in blocks]
    assert got == [
        [("baseline", s, s) for s in range(4)],
        [("ngram", s, s) for s in range(4)],
        [("ngram", s, s % 5) for s in range(4, 8)],
        [("baseline", s, s % 5) for s in range(4, 8)],
    ]
    jobs = [j for block in blocks for j in block]
    assert {j.concurrency for j in jobs} == {4} and {j.load for j in jobs} == {"concurrency=4"}
    # a pair shares prompt, seed and sampling
    by_sample = {}
    for j in jobs:
        by_sample.setdefault(j.sample_index, set()).add((j.text_input, j.seed, j.max_tokens))
    assert all(len(v) == 1 for v in by_sample.values())


def test_a_level_above_the_prompts_is_warned_once_and_recorded(tmp_path: Any) -> None:
    run, route, said = _run(tmp_path, prompts=3)
    run._check_repeats(route, ("concurrency=4", 4, None))
    run._check_repeats(route, ("concurrency=4", 4, None))
    run._check_repeats(route, ("concurrency=2", 2, None))
    assert run.block_repeats == [{"route": "r", "load": "concurrency=4", "prompts": 3}]
    assert said == [
        "bench: warning: route=r concurrency=4: 3 prompt(s) for blocks of 4, so a block "
        "sends a prompt twice and its arms may start from different cache states (the report "
        "lists any prompt whose prefix_reused_tokens differ); give the route at least as many "
        "prompts as its highest level"
    ]
    warm, route, said = _run(tmp_path, prompts=3, policy="warm")
    warm._check_repeats(route, ("concurrency=4", 4, None))
    assert warm.block_repeats == [] and said == []


def test_the_report_says_what_a_level_counts_and_where_blocks_repeated() -> None:
    from trtspec.bench.report_notes import level_notes

    summary = {
        "settings": {"level_unit": "requests of one arm in flight"},
        "cells": [{"concurrency": 1}, {"concurrency": 8}, {"concurrency": None}],
        "block_repeats": [{"route": "r", "load": "concurrency=8", "prompts": 3}],
    }
    assert level_notes(summary) == [
        "load levels: concurrency=c is c requests of one arm in flight (each arm in turn "
        "sends a block of c prompts, arm order alternating per block, every prompt paired "
        "over the arms): the unit of routing.yaml's max_concurrency and draft_len_schedule",
        "r concurrency=8: 3 prompt(s) for blocks of that level, so a block sent a prompt "
        "twice and its arms may have started from different cache states",
    ]
    # one request at a time needs no note; a run from before the unit was recorded gets none
    assert level_notes({**summary, "cells": [{"concurrency": 1}], "block_repeats": []}) == []
    assert level_notes({"cells": [{"concurrency": 8}]}) == []


def test_the_report_says_when_a_later_level_found_an_earlier_levels_cache() -> None:
    from trtspec.bench.report_notes import cross_level_notes

    def cell(route: str, variant: str, level: int, reused: float | None) -> dict:
        return {
            "route": route,
            "variant": variant,
            "concurrency": level,
            "temperature": 0.0,
            "prefix_reused_tokens_mean": reused,
        }

    summary = {
        "cells": [
            cell("sum", "baseline", 4, 900.0),
            cell("sum", "baseline", 1, 12.4),
            cell("sum", "ngram", 4, 900.0),
            cell("rag", "baseline", 1, 0.0),
            cell("rag", "baseline", 4, 0.0),
            cell("new", "baseline", 1, None),
            cell("new", "baseline", 4, 64.0),
        ]
    }
    assert cross_level_notes(summary) == [
        "sum: the baseline reused 900 prompt tokens per request at concurrency=4 against "
        "12 at concurrency=1: that level found KV blocks an earlier level cached (every "
        "arm alike), so compare its TTFT, goodput and throughput within the level, not "
        "across levels"
    ]
