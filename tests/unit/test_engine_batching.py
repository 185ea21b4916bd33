"""In-flight batching: many requests in one packed forward per step, each exactly as alone.

Engines are built once per module from the shared tiny Llama (every mode).
Requests of different prompt lengths, output lengths and arrival times run
through one ``BatchScheduler``; each must produce exactly the tokens and
draft counters it produces alone (T=0 and, with its own seed, T>0), steps
must stay within ``max_num_tokens`` (counted at the forward itself) and
``max_batch_size``, and a cancelled request must leave the batch at the next
step while its neighbours go on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from trtspec.runtime.engine import (
    GenerationRequest,
    ReferenceEngine,
    SamplingParams,
    batching,
    fastpath,
)
from trtspec.runtime.engine.batching import BatchScheduler, serve_all, wait_idle

MODES = ["none", "dte", "medusa", "eagle", "lookahead"]
PROMPTS = [
    list(range(5, 40)),
    [7, 8, 9, 10] * 8,
    [100, 101, 250, 3, 44, 44, 44, 17],
    [3, 4],
    list(range(60, 190)),
]


@pytest.fixture(scope="module")
def loaded(every_mode_engines: dict[str, Path]) -> dict[str, ReferenceEngine]:
    # kv_reuse off: a request's cost must not depend on what ran before it
    return {
        name: ReferenceEngine.load(p, threads=1, kv_reuse=0)
        for name, p in every_mode_engines.items()
    }


def _requests(mode: str) -> list[GenerationRequest]:
    reqs = []
    for i, prompt in enumerate(PROMPTS):
        if mode == "dte":  # one verification step; the first draft token sometimes agrees
            reqs.append(GenerationRequest(prompt, 6, draft_ids=[prompt[-1], 5, 6, 7][: 1 + i % 4]))
        else:
            reqs.append(GenerationRequest(prompt, 9 + 7 * i))
    reqs.append(
        GenerationRequest(
            PROMPTS[0],
            12,
            draft_ids=[9, 2] if mode == "dte" else None,
            sampling=SamplingParams(temperature=1.0, top_k=5, seed=3),
        )
    )
    return reqs


def _facts(gen) -> tuple:
    return (gen.output_ids, gen.total_draft_tokens, gen.total_accepted_draft_tokens, gen.steps)


def _count_rows(monkeypatch: pytest.MonkeyPatch, engine: ReferenceEngine) -> list[int]:
    """Record the rows of every target forward the scheduler runs."""
    rows: list[int] = []
    packed, solo = fastpath.forward_packed, engine._forward

    def counting_packed(model, ids, segments):
        rows.append(int(ids.shape[1]))
        return packed(model, ids, segments)

    def counting_solo(tokens, *args, **kwargs):
        rows.append(len(tokens))
        return solo(tokens, *args, **kwargs)

    monkeypatch.setattr(fastpath, "forward_packed", counting_packed)
    monkeypatch.setattr(engine, "_forward", counting_solo)
    return rows


@pytest.mark.parametrize("mode", MODES)
def test_mixed_batch_equals_each_request_alone(
    loaded, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = loaded[mode]
    reqs = _requests(mode)
    alone = [_facts(engine.generate(r)) for r in reqs]
    # The late requests must join while the first three are mid-flight; on a
    # loaded machine the scheduler thread could otherwise finish them before
    # this thread submits. So the scheduler's forwards wait at a gate, closed
    # from the first token until every late request is queued.
    gate = threading.Event()
    gate.set()
    for owner, name in ((fastpath, "forward_packed"), (engine, "_forward")):
        inner = getattr(owner, name)

        def gated(*args, _inner=inner, **kwargs):
            assert gate.wait(timeout=120), "the test never reopened the gate"
            return _inner(*args, **kwargs)

        monkeypatch.setattr(owner, name, gated)
    scheduler = BatchScheduler(engine, max_batch_size=8)
    try:
        first = [scheduler.submit(r) for r in reqs[:3]]
        next(iter(first[0]))  # the others join while these are mid-flight
        gate.clear()
        late = [scheduler.submit(r) for r in reqs[3:]]
        gate.set()
        gens = first + late
        for gen in gens:
            for _ in gen:
                pass
    finally:
        gate.set()
        scheduler.close()
    assert [_facts(g) for g in gens] == alone
    st = scheduler.stats
    assert st.max_step_sequences >= 3 if mode != "dte" else st.max_step_sequences >= 2
    if mode != "dte":  # a one-step mode has no decode for a later prefill to meet
        assert st.mixed_steps >= 1  # prefill and decode/verification trees in one forward
    assert st.finished == len(reqs)


@pytest.mark.parametrize("mode", ["none", "eagle", "lookahead"])
def test_step_never_exceeds_max_num_tokens(
    loaded, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = loaded[mode]
    reqs = _requests(mode)
    alone = [_facts(engine.generate(r)) for r in reqs]
    rows = _count_rows(monkeypatch, engine)
    scheduler = BatchScheduler(engine, max_batch_size=8, max_num_tokens=24)
    try:
        gens = serve_all(scheduler, reqs)
    finally:
        scheduler.close()
    assert rows and max(rows) <= 24, rows
    # prompts longer than the budget were prefilled in chunks, outputs unchanged
    assert scheduler.stats.chunked_steps > 0
    assert [_facts(g) for g in gens] == alone


def test_max_batch_size_bounds_a_step_and_waiting_requests_are_fifo(loaded) -> None:
    engine = loaded["none"]
    reqs = [GenerationRequest(p, 10) for p in PROMPTS]
    scheduler = BatchScheduler(engine, max_batch_size=2)
    try:
        gens = serve_all(scheduler, reqs)
    finally:
        scheduler.close()
    assert scheduler.stats.max_step_sequences == 2
    starts = [g.first_scheduled_time_ns for g in gens]
    assert starts == sorted(starts)
    assert [g.output_ids for g in gens] == [engine.generate(r).output_ids for r in reqs]


def test_engine_budget_comes_from_the_engine_config(loaded) -> None:
    engine = loaded["dte"]
    scheduler = BatchScheduler(engine)
    build = engine.config.raw["build_config"]
    assert scheduler.max_batch_size == engine.config.max_batch_size == build["max_batch_size"]
    assert scheduler.max_num_tokens == build["max_num_tokens"]


def test_sampled_outputs_do_not_depend_on_batch_neighbours(loaded) -> None:
    # T > 0: every request owns its seeded generator, so a request's sample
    # is the same alone or in any batch; the solo distribution tests in
    # test_engine_decode.py then carry over to batches.
    for mode in ("none", "medusa", "lookahead"):
        engine = loaded[mode]
        reqs = [
            GenerationRequest(
                PROMPTS[i % 3], 12, sampling=SamplingParams(temperature=1.3, top_k=4, seed=seed)
            )
            for i, seed in enumerate(range(40, 52))
        ]
        alone = [engine.generate(r).output_ids for r in reqs]
        scheduler = BatchScheduler(engine, max_batch_size=12)
        try:
            gens = serve_all(scheduler, reqs)
        finally:
            scheduler.close()
        assert [g.output_ids for g in gens] == alone, mode
        assert len({tuple(a) for a in alone}) > 1


def test_sampling_distribution_holds_in_a_batch(loaded) -> None:
    from tests.unit.test_engine_decode import _CHI2_999, _chi_square, _exact_pair_probs
    from transformers import AutoModelForCausalLM

    engine = loaded["medusa"]
    hf = AutoModelForCausalLM.from_pretrained(str(loaded["none"].config.hf_dir)).eval()
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=1.5, top_k=3)
    probs = _exact_pair_probs(hf, prompt, params)
    n = 400
    reqs = [
        GenerationRequest(
            prompt, 2, sampling=SamplingParams(temperature=1.5, top_k=3, seed=5000 + s)
        )
        for s in range(n)
    ]
    scheduler = BatchScheduler(engine, max_batch_size=16)
    try:
        gens = serve_all(scheduler, reqs)
    finally:
        scheduler.close()
    assert scheduler.stats.max_step_sequences == 16
    counts: dict = {}
    for gen in gens:
        key = tuple(gen.output_ids)
        counts[key] = counts.get(key, 0) + 1
    stat, dof = _chi_square(counts, probs, n)
    assert dof >= 1
    assert stat < _CHI2_999[min(dof, len(_CHI2_999)) - 1], (stat, dof, counts, probs)


def test_cancellation_mid_batch_frees_the_sequence(loaded, monkeypatch) -> None:
    engine = loaded["eagle"]
    monkeypatch.setattr(batching, "POLL_NS", 0)
    reqs = [GenerationRequest(PROMPTS[i], 60) for i in range(3)]
    alone = [engine.generate(r).output_ids for r in reqs]
    polled = threading.Event()
    scheduler = BatchScheduler(engine, max_batch_size=2)
    try:
        a = scheduler.submit(reqs[0])
        b = scheduler.submit(reqs[1], is_cancelled=polled.is_set)  # Triton's poll
        c = scheduler.submit(reqs[2])  # waits for a free slot
        next(iter(a))
        a.cancel()
        next(iter(b))
        polled.set()
        rest_c = [t for d in c for t in d]
        assert wait_idle(scheduler)
        for gen in (a, b):
            for _ in gen:
                pass
    finally:
        scheduler.close()
    assert a.cancelled and b.cancelled and not c.cancelled
    assert len(a.output_ids) < 60 and len(b.output_ids) < 60
    assert alone[0][: len(a.output_ids)] == a.output_ids  # what it sent was right
    assert rest_c == c.output_ids == alone[2]
    assert scheduler.stats.cancelled == 2 and scheduler.stats.finished == 1
    # with two slots, c ran only because a cancelled sequence gave its slot up
    assert c.first_scheduled_time_ns > 0 and scheduler.stats.max_step_sequences <= 2


def test_a_failing_request_fails_alone(loaded, monkeypatch) -> None:
    engine = loaded["medusa"]
    good = GenerationRequest(PROMPTS[0], 10)
    bad = GenerationRequest(PROMPTS[1], 10)
    expected = engine.generate(good).output_ids
    real = engine._loop

    def failing(gen):
        inner = real(gen)
        yield next(inner)  # its first forward runs in the batch, then it breaks
        raise RuntimeError("failure on purpose")

    monkeypatch.setattr(
        engine, "_loop", lambda gen: failing(gen) if gen.request is bad else real(gen)
    )
    scheduler = BatchScheduler(engine, max_batch_size=4)
    try:
        g1 = scheduler.submit(good)
        next(iter(g1))
        g2 = scheduler.submit(bad)
        with pytest.raises(RuntimeError, match="failure on purpose"):
            for _ in g2:
                pass
        for _ in g1:
            pass
    finally:
        scheduler.close()
    assert g1.output_ids == expected
    assert scheduler.stats.finished == 1


def test_an_idle_scheduler_trims_the_heap_once_and_not_between_close_requests(
    loaded, monkeypatch
) -> None:
    from trtspec.runtime.engine import loader

    engine = loaded["none"]
    trims: list[int] = []
    monkeypatch.setattr(loader, "release_free_memory", lambda: trims.append(1) or True)
    monkeypatch.setattr(batching, "IDLE_TRIM_S", 1.0)  # far above a gap between calls
    monkeypatch.setattr(batching, "TRIM_EVERY_S", 0.0)
    scheduler = BatchScheduler(engine)
    try:
        # a draft loop's rounds: each request follows the last within the idle wait
        for prompt in PROMPTS[:3]:
            scheduler.generate(GenerationRequest(prompt, 3))
        assert trims == [] and scheduler.stats.trims == 0
        deadline = time.monotonic() + 10
        while not trims and time.monotonic() < deadline:
            time.sleep(0.05)
        assert trims == [1] and scheduler.stats.trims == 1
        time.sleep(1.3)  # idle on: nothing ended since, no second trim
        assert trims == [1]
        gen = scheduler.generate(GenerationRequest(PROMPTS[0], 3))
        deadline = time.monotonic() + 10
        while len(trims) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(trims) == 2
        # at most one trim every TRIM_EVERY_S, however long the idle
        monkeypatch.setattr(batching, "TRIM_EVERY_S", 60.0)
        scheduler.generate(GenerationRequest(PROMPTS[1], 3))
        time.sleep(1.5)
        assert len(trims) == 2
    finally:
        scheduler.close()
    assert gen.output_ids == engine.generate(GenerationRequest(PROMPTS[0], 3)).output_ids
