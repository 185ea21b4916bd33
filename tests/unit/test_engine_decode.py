"""The reference engine in process: KV-cached decoding, every mode lossless, exact accounting.

Engines are built once per module from the shared tiny Llama (random Medusa
heads and EAGLE layer in their public formats). At temperature 0 every mode
must reproduce target-only tokens exactly; at temperature > 0 the
speculative output must follow the target's own distribution (checked by a
chi-square test against the exact probabilities on a top-3 vocabulary).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trtspec.runtime.engine import GenerationRequest, ReferenceEngine, RequestError, SamplingParams

PROMPTS = [
    list(range(5, 40)),
    [7, 8, 9, 10] * 8,  # repetitive: lookahead's pool and the KV reuse get hits
    [100, 101, 250, 3, 44, 44, 44, 17],
]


@pytest.fixture(scope="module")
def loaded(every_mode_engines: dict[str, Path]) -> dict[str, ReferenceEngine]:
    return {
        name: ReferenceEngine.load(path, threads=1) for name, path in every_mode_engines.items()
    }


@pytest.fixture(scope="module")
def hf_model(hf_tiny_llama):
    return hf_tiny_llama


@pytest.fixture(scope="module")
def truth(hf_greedy):
    """``truth(prompt, n)``: Hugging Face greedy ``generate()`` on the tiny
    Llama (the session's ``hf_greedy``), never the engine under test."""
    return hf_greedy


@pytest.mark.parametrize("prompt", PROMPTS, ids=range(len(PROMPTS)))
def test_target_only_matches_hf_generate_and_never_reencodes(truth, loaded, prompt) -> None:
    engine = ReferenceEngine(
        loaded["none"].config, loaded["none"].model, lookahead=None, medusa_choices=None, kv_reuse=0
    )
    gen = engine.generate(GenerationRequest(prompt, 40))
    assert gen.output_ids == truth(prompt, 40)
    # The prompt once, then one new token per step: no prefix re-encoding.
    assert gen.encoded_tokens == len(prompt) + 39
    assert gen.steps == 40


@pytest.mark.parametrize("mode", ["medusa", "eagle", "lookahead"])
@pytest.mark.parametrize("prompt_index", range(len(PROMPTS)))
def test_greedy_is_lossless(truth, loaded, mode: str, prompt_index: int) -> None:
    prompt = PROMPTS[prompt_index]
    expected = truth(prompt, 40)
    gen = loaded[mode].generate(GenerationRequest(prompt, 40))
    assert gen.output_ids == expected
    assert 0 <= gen.total_accepted_draft_tokens <= gen.total_draft_tokens
    # Every accepted draft token saved one step.
    assert gen.steps == 40 - gen.total_accepted_draft_tokens


def test_medusa_and_eagle_trees_are_drafted_every_step(loaded) -> None:
    # After the prefill step every step drafts the whole choice tree (6 nodes),
    # except where the output budget cuts it.
    for mode in ("medusa", "eagle"):
        gen = loaded[mode].generate(GenerationRequest(PROMPTS[0], 40))
        assert 6 * (gen.steps - 3) <= gen.total_draft_tokens <= 6 * (gen.steps - 1), mode


def test_eagle_tree_siblings_do_not_leak_into_the_chain(loaded) -> None:
    """The [0]-path of a tree equals the pure top-1 chain: the tree mask isolates branches."""
    import torch

    from trtspec.runtime.engine.kv_reuse import make_cache

    tree = loaded["eagle"]
    chain = ReferenceEngine(
        tree.config,
        tree.model,
        lookahead=None,
        medusa_choices=None,
        eagle_choices=[[0], [0, 0], [0, 0, 0]],
        eagle=tree.eagle,
        kv_reuse=0,
    )
    prompt = PROMPTS[0]
    with torch.inference_mode():
        feats = tree.hidden_states(prompt[:-1])
        args = (prompt[:-1], prompt[-1], feats)
        # the EAGLE layer is a transformers LlamaModel: its cache is a DynamicCache
        n1, p1, _, _ = chain._propose_eagle(*args, make_cache(hf=True), fed=0, budget=10)
        n2, p2, _, fed = tree._propose_eagle(*args, make_cache(hf=True), fed=0, budget=10)
        # The chain by hand: one plain causal EAGLE step at a time.
        cache, m = make_cache(hf=True), len(prompt) - 1
        h, lg = tree.eagle.forward(
            torch.tensor([prompt[1:]]), feats[None], torch.arange(m)[None], cache
        )
        manual, last = [], h[:, -1:]
        for j in range(3):
            manual.append(int(torch.argmax(lg[0, -1])))
            last, lg = tree.eagle.forward(
                torch.tensor([[manual[-1]]]), last, torch.tensor([[m + j]]), cache
            )
    assert n1 == manual
    # tree order: [0], [1], [0,0], [0,1], [1,0], [0,0,0]
    assert p1 == [-1, 0, 1]
    assert p2 == [-1, -1, 0, 0, 1, 2]
    assert [n2[0], n2[2], n2[5]] == n1
    assert n2[0] != n2[1] and n2[2] != n2[3]
    assert fed == len(prompt) - 1


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_external_draft_accounting_property(truth, loaded, data) -> None:
    prompt = PROMPTS[0]
    expected = truth(prompt, 5)
    # Each draft position is the true token or a random one: agreement varies.
    draft = [
        data.draw(st.sampled_from([expected[i], (expected[i] + 7) % 384]))
        for i in range(data.draw(st.integers(1, 4)))
    ]
    gen = loaded["dte"].generate(GenerationRequest(prompt, len(draft) + 1, draft_ids=draft))
    agree = next((i for i, t in enumerate(draft) if t != expected[i]), len(draft))
    assert gen.total_accepted_draft_tokens == agree <= gen.total_draft_tokens == len(draft)
    assert gen.output_ids == expected[: agree + 1]


def test_lookahead_accepts_on_repetitive_text(loaded) -> None:
    gen = loaded["lookahead"].generate(GenerationRequest(PROMPTS[1], 40))
    assert gen.total_accepted_draft_tokens > 5
    assert gen.steps <= 40 - gen.total_accepted_draft_tokens + 1


@pytest.mark.parametrize("agree", range(5))
def test_draft_tokens_external_accounting_is_exact(truth, loaded, agree: int) -> None:
    prompt = PROMPTS[2]
    expected = truth(prompt, 5)
    draft = expected[:4]
    if agree < 4:
        draft = [*expected[:agree], (expected[agree] + 1) % 384, *expected[agree + 1 : 4]]
    gen = loaded["dte"].generate(GenerationRequest(prompt, len(draft) + 1, draft_ids=draft))
    assert gen.output_ids == expected[: agree + 1]  # accepted prefix + the target's token
    assert gen.total_draft_tokens == 4
    assert gen.total_accepted_draft_tokens == agree
    assert gen.steps == 1
    assert gen.acceptance_rate == agree / 4


def _draft_loop(
    truth, draft: ReferenceEngine, target: ReferenceEngine, *, by_logits: bool
) -> tuple[int, int, int, int]:
    """The BLS loop in process at T=0 over 30 tokens of PROMPTS[0], k = 4:
    the draft proposes (with its logits when ``by_logits``), the target
    verifies. Each round's accepted count is checked to be exactly the
    proposal's agreement with the target-only continuation, and the output
    to be that continuation. Returns (drafted, accepted, rounds, rounds with
    a rejection)."""
    import torch

    prompt, n, k = PROMPTS[0], 30, 4
    expected = truth(prompt, n)
    seq = list(prompt)
    drafted = accepted = rounds = rejected = 0
    while len(seq) < len(prompt) + n:
        want = min(k, len(prompt) + n - len(seq) - 1)
        proposal, rows = [], None
        if want > 0:
            got = draft.generate(GenerationRequest(seq, want, return_generation_logits=by_logits))
            proposal = got.output_ids
            rows = torch.stack(got.generation_logits) if by_logits else None
        gen = target.generate(
            GenerationRequest(seq, len(proposal) + 1, draft_ids=proposal or None, draft_logits=rows)
        )
        # Exact by construction: the accepted count is the proposal's agreement
        # with the target-only continuation (the target's argmax, never the draft's).
        ref = expected[len(seq) - len(prompt) :]
        pairs = enumerate(zip(proposal, ref, strict=False))
        agree = next((i for i, (a, b) in pairs if a != b), len(proposal))
        assert gen.total_accepted_draft_tokens == agree
        assert gen.output_ids == ref[: agree + 1]
        drafted += gen.total_draft_tokens
        accepted += gen.total_accepted_draft_tokens
        rejected += agree < len(proposal)
        seq += gen.output_ids
        rounds += 1
    assert seq[len(prompt) :] == expected
    return drafted, accepted, rounds, rejected


def test_draft_loop_with_a_partly_agreeing_draft_model(
    truth, tiny_draft: Path, loaded, tmp_path
) -> None:
    """The BLS loop in process: draft engine proposes, dte target verifies."""
    from tests.fixtures.spec_checkpoints import build_engine

    draft = ReferenceEngine.load(build_engine(tiny_draft, tmp_path / "draft", "none"), threads=1)
    drafted, accepted, rounds, _ = _draft_loop(truth, draft, loaded["dte"], by_logits=False)
    assert 0 < accepted < drafted  # the noisy draft agrees on some tokens, not all
    assert rounds < 30


def test_kv_cache_reuse_across_requests(truth, loaded) -> None:
    engine = loaded["dte"]
    prompt = [*PROMPTS[0], 60, 61]
    first = engine.generate(GenerationRequest(prompt, 5))
    follow = [*prompt, *first.output_ids, 70]
    second = engine.generate(GenerationRequest(follow, 6))
    assert second.reused_tokens == len(prompt) + 4  # all committed tokens of the first
    assert second.encoded_tokens == (len(follow) - second.reused_tokens) + 5
    assert second.output_ids == truth(follow, 6)
    # A diverging prompt reuses only the common prefix.
    third = engine.generate(GenerationRequest([*prompt[:10], 3, 4, 5], 3))
    assert third.reused_tokens == 10
    assert third.output_ids == truth([*prompt[:10], 3, 4, 5], 3)
    # After clear() (the benchmark's cold start) nothing is reused.
    engine.prefix_cache.clear()
    cold = engine.generate(GenerationRequest(follow, 6))
    assert (len(engine.prefix_cache), cold.reused_tokens) == (1, 0)
    assert cold.output_ids == second.output_ids


def test_streaming_deltas_and_end_id(truth, loaded) -> None:
    engine = loaded["lookahead"]
    expected = truth(PROMPTS[1], 30)
    gen = engine.stream(GenerationRequest(PROMPTS[1], 30))
    deltas = list(gen)
    assert [t for d in deltas for t in d] == expected
    assert len(deltas) == gen.steps
    assert gen.finished
    # end_id stops generation and is not part of the output.
    stop_at = expected[5]
    cut = expected.index(stop_at)
    gen = engine.generate(GenerationRequest(PROMPTS[1], 30, end_id=stop_at))
    assert gen.output_ids == expected[:cut]
    # min_tokens keeps end_id from being picked before that many tokens.
    gen = loaded["none"].generate(
        GenerationRequest(PROMPTS[1], 4, end_id=expected[0], min_tokens=2)
    )
    assert len(gen.output_ids) >= 2 and expected[0] not in gen.output_ids[:2]


def test_sampling_is_reproducible_per_seed(truth, loaded) -> None:
    def run(seed: int) -> list[int]:
        return (
            loaded["lookahead"]
            .generate(
                GenerationRequest(
                    PROMPTS[0], 16, sampling=(SamplingParams(temperature=1.0, top_p=0.9, seed=seed))
                )
            )
            .output_ids
        )

    assert run(3) == run(3)
    assert len({tuple(run(s)) for s in range(4)}) > 1
    # TRT-LLM's rule: top_k 0 with top_p 0 is greedy, whatever the temperature.
    greedy = (
        loaded["none"]
        .generate(
            GenerationRequest(
                PROMPTS[0], 8, sampling=SamplingParams(temperature=1.0, top_k=0, top_p=0.0, seed=5)
            )
        )
        .output_ids
    )
    assert greedy == truth(PROMPTS[0], 8)


def _exact_pair_probs(model, prompt: list[int], sampler_params: SamplingParams) -> dict:
    """P(t1, t2) under the target's own sampling distribution, computed directly."""
    import torch

    from trtspec.runtime.engine.sampling import Sampler

    sampler = Sampler(sampler_params)
    with torch.inference_mode():
        p1 = sampler.probs(model(torch.tensor([prompt])).logits[0, -1])
        probs = {}
        for t1 in torch.nonzero(p1).reshape(-1).tolist():
            p2 = sampler.probs(model(torch.tensor([[*prompt, t1]])).logits[0, -1])
            for t2 in torch.nonzero(p2).reshape(-1).tolist():
                probs[(t1, t2)] = float(p1[t1] * p2[t2])
    return probs


def _chi_square(counts: dict, probs: dict, n: int) -> tuple[float, int]:
    stat, dof, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for key, p in probs.items():
        exp = p * n
        if exp < 5:
            pooled_obs += counts.get(key, 0)
            pooled_exp += exp
            continue
        stat += (counts.get(key, 0) - exp) ** 2 / exp
        dof += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        dof += 1
    outside = sum(c for k, c in counts.items() if k not in probs)
    assert outside == 0, f"{outside} samples outside the target's support"
    return stat, dof


# chi-square 99.9% quantiles, dof 1..12: a correct sampler fails ~1 run in 1000
_CHI2_999 = [10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12, 27.88, 29.59, 31.26, 32.91]


@pytest.mark.parametrize("mode", ["dte", "medusa", "lookahead"])
def test_sampling_distribution_matches_target(truth, loaded, hf_model, mode: str) -> None:
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=1.5, top_k=3)
    probs = _exact_pair_probs(hf_model, prompt, params)
    greedy = truth(prompt, 2)
    n, counts, firsts, accepted = 600, {}, {}, 0
    for seed in range(n):
        req = GenerationRequest(
            prompt,
            2,
            sampling=SamplingParams(temperature=1.5, top_k=3, seed=1000 + seed),
            draft_ids=greedy[:1] if mode == "dte" else None,
        )
        gen = loaded[mode].generate(req)
        first = gen.output_ids[0]
        firsts[(first,)] = firsts.get((first,), 0) + 1
        if len(gen.output_ids) == 2:
            key = tuple(gen.output_ids)
            counts[key] = counts.get(key, 0) + 1
        accepted += gen.total_accepted_draft_tokens
    # The first token's marginal: whatever was drafted, it is the target's.
    marginal: dict = {}
    for (t1, _), p in probs.items():
        marginal[(t1,)] = marginal.get((t1,), 0.0) + p
    stat, dof = _chi_square(firsts, marginal, n)
    assert stat < _CHI2_999[max(dof, 1) - 1], (stat, dof, firsts, marginal)
    if mode == "dte":
        # A rejected draft ends the (single) verification step after one token:
        # pairs exist exactly for the samples whose first token matched the draft.
        total = sum(counts.values())
        assert accepted == total == firsts.get((greedy[0],), 0)
        probs = {k: v for k, v in probs.items() if k[0] == greedy[0]}
        norm = sum(probs.values())
        probs = {k: v / norm for k, v in probs.items()}
        n = total
        assert total > 100
    stat, dof = _chi_square(counts, probs, n)
    assert dof >= 1
    assert stat < _CHI2_999[min(dof, len(_CHI2_999)) - 1], (stat, dof, counts, probs)
    assert not math.isnan(stat)


def test_bad_requests_have_trtllm_wording(truth, loaded) -> None:
    dte, la, none = loaded["dte"], loaded["lookahead"], loaded["none"]
    cases = [
        (
            dte,
            GenerationRequest(PROMPTS[0], 7, draft_ids=[1] * 6),
            "Number of draft tokens (6) is larger than maximum number of draft tokens (4)",
        ),
        (
            none,
            GenerationRequest(PROMPTS[0], 3, draft_ids=[1, 2]),
            "Number of draft tokens (2) is larger than maximum number of draft tokens (0)",
        ),
        (
            dte,
            GenerationRequest([3] * 513, 4),
            "Prompt length (513) exceeds maximum input length (512).",
        ),
        (
            dte,
            GenerationRequest([3] * 500, 600),
            "Prompt length + number of requested output tokens (500 + 600) exceeds maximum "
            "sequence length (1028).",
        ),
        (
            la,
            GenerationRequest(PROMPTS[0], 4, lookahead=(5, 3, 4)),
            "Lookahead config (w=5, n=3, g=4) is not within the engine's (W=4, N=3, G=4): "
            "need 1 <= w <= W, 1 <= n <= N, 0 <= g <= G",
        ),
        (
            none,
            GenerationRequest(PROMPTS[0], 4, lookahead=(2, 2, 1)),
            "lookahead_window_size/ngram_size/verification_set_size given, but the engine was "
            "not built for lookahead decoding",
        ),
        (
            none,
            GenerationRequest([], 4),
            "input_ids is empty: a request needs at least one prompt token",
        ),
        (
            none,
            GenerationRequest([1, 999], 4),
            "input_ids contains token id 999 outside the vocabulary [0, 384)",
        ),
        (none, GenerationRequest([1, 2], 0), "request_output_len must be at least 1 (got 0)"),
        (
            loaded["medusa"],
            GenerationRequest(PROMPTS[0], 3, draft_ids=[1]),
            "draft_input_ids given, but this engine's speculative decoding mode is medusa; only "
            "draft_tokens_external engines verify external drafts",
        ),
    ]
    for engine, req, message in cases:
        with pytest.raises(RequestError) as err:
            engine.stream(req)
        assert str(err.value) == message
    # Smaller per-request lookahead configs are fine and still lossless.
    gen = la.generate(GenerationRequest(PROMPTS[1], 20, lookahead=(2, 2, 1)))
    assert gen.output_ids == truth(PROMPTS[1], 20)


def test_int8_draft_engine_mostly_agrees(truth, tiny_llama: Path, loaded, tmp_path) -> None:
    from tests.fixtures.spec_checkpoints import build_engine

    path = build_engine(tiny_llama, tmp_path / "int8", "none", extra=["--quantization", "int8"])
    engine = ReferenceEngine.load(path, threads=1)
    assert engine.config.quantization == "int8"
    assert (
        "Quantized" in type(engine.model.lm_head).__name__
        or "quantized" in type(engine.model.lm_head).__module__
    )
    expected = truth(PROMPTS[0], 20)
    got = engine.generate(GenerationRequest(PROMPTS[0], 20)).output_ids
    assert sum(a == b for a, b in zip(got, expected, strict=True)) >= 5


@pytest.mark.parametrize("mode", ["none", "lookahead"])
def test_a_cancelled_generation_stops_before_the_next_step_and_frees_its_cache(
    truth, loaded, mode: str
) -> None:
    base = loaded[mode]
    engine = ReferenceEngine(
        base.config, base.model, lookahead=base.lookahead, medusa_choices=None, kv_reuse=4
    )
    asked: list[int] = []

    def cancelled() -> bool:
        asked.append(gen.steps)
        return gen.steps >= 3

    gen = engine.stream(GenerationRequest(PROMPTS[1], 40), cancelled=cancelled)
    deltas = list(gen)
    assert gen.cancelled and not gen.finished
    assert gen.steps == 3 and len(deltas) == 3  # asked before every step, stopped at the 4th
    assert asked == [0, 1, 2, 3]
    assert len(gen.output_ids) < 40
    assert len(engine.prefix_cache) == 0  # the sequence's KV is dropped, not kept for reuse
    # the engine serves the next request as if nothing happened
    again = engine.generate(GenerationRequest(PROMPTS[1], 8))
    assert again.output_ids == truth(PROMPTS[1], 8)


# ---- accept by draft logits (TRT-LLM's use_draft_logits): speculative sampling


@pytest.fixture(scope="module")
def draft_engine(tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory) -> ReferenceEngine:
    from tests.fixtures.spec_checkpoints import build_engine

    path = build_engine(tiny_draft, tmp_path_factory.mktemp("draft") / "draft", "none")
    return ReferenceEngine.load(path, threads=1, kv_reuse=0)


def _logits_round(
    draft: ReferenceEngine,
    target: ReferenceEngine,
    seq: list[int],
    k: int,
    *,
    params: SamplingParams,
    seed: int,
    by_logits: bool,
):
    """One BLS round as the orchestrator runs it: the draft samples k tokens
    (returning its logits when asked), the target verifies them."""
    import dataclasses

    import torch

    proposal = draft.generate(
        GenerationRequest(
            seq,
            k,
            sampling=dataclasses.replace(params, seed=seed),
            return_generation_logits=by_logits,
        )
    )
    assert len(proposal.generation_logits) == (len(proposal.output_ids) if by_logits else 0)
    rows = torch.stack(proposal.generation_logits) if by_logits else None
    return target.generate(
        GenerationRequest(
            seq,
            len(proposal.output_ids) + 1,
            sampling=dataclasses.replace(params, seed=seed + 1),
            draft_ids=proposal.output_ids,
            draft_logits=rows,
        )
    )


def test_accept_by_logits_keeps_the_target_distribution(loaded, hf_model, draft_engine) -> None:
    """The draft loop with draft_logits at T > 0: the first two tokens are
    distributed exactly like target-only sampling (chi-square on a top-3 vocab)."""
    prompt = PROMPTS[2]
    params = SamplingParams(temperature=1.5, top_k=3)
    probs = _exact_pair_probs(hf_model, prompt, params)
    n, counts, drafted, accepted = 600, {}, 0, 0
    for sample in range(n):
        seq, seed = list(prompt), 10_000 + 100 * sample
        while len(seq) < len(prompt) + 2:
            gen = _logits_round(
                draft_engine, loaded["dte"], seq, 2, params=params, seed=seed, by_logits=True
            )
            drafted += gen.total_draft_tokens
            accepted += gen.total_accepted_draft_tokens
            seq += gen.output_ids
            seed += 2
        key = tuple(seq[len(prompt) : len(prompt) + 2])
        counts[key] = counts.get(key, 0) + 1
    stat, dof = _chi_square(counts, probs, n)
    assert dof >= 2
    assert stat < _CHI2_999[min(dof, len(_CHI2_999)) - 1], (stat, dof, counts, probs)
    assert 0 < accepted < drafted


def test_accept_by_logits_beats_matching_at_temperature(loaded, draft_engine) -> None:
    """Same prompts, same seeds: min(1, p/q) keeps more draft tokens than
    matching the target's own draw (E[sum min(p, q)] >= E[sum p*q])."""
    params = SamplingParams(temperature=1.0)
    totals = {}
    for by_logits in (False, True):
        drafted = accepted = 0
        for prompt in PROMPTS:
            for seed in range(0, 60, 2):
                gen = _logits_round(
                    draft_engine,
                    loaded["dte"],
                    prompt,
                    4,
                    params=params,
                    seed=seed,
                    by_logits=by_logits,
                )
                drafted += gen.total_draft_tokens
                accepted += gen.total_accepted_draft_tokens
        totals[by_logits] = (accepted, drafted)
    (match_acc, match_n), (logit_acc, logit_n) = totals[False], totals[True]
    assert match_n == logit_n == 4 * 30 * len(PROMPTS)
    assert logit_acc > 2 * match_acc + 0.2 * logit_n, totals


def test_accept_by_logits_at_temperature_zero_is_matching(truth, loaded, draft_engine) -> None:
    """Greedy: p is one-hot, so speculative sampling keeps exactly the matching prefix."""
    for prompt in PROMPTS:
        plain = _logits_round(
            draft_engine, loaded["dte"], prompt, 4, params=SamplingParams(), seed=0, by_logits=False
        )
        by_logits = _logits_round(
            draft_engine, loaded["dte"], prompt, 4, params=SamplingParams(), seed=0, by_logits=True
        )
        assert by_logits.output_ids == plain.output_ids == truth(prompt, len(plain.output_ids))
        assert by_logits.total_accepted_draft_tokens == plain.total_accepted_draft_tokens


def test_accept_by_logits_at_temperature_zero_rejects_where_the_draft_disagrees(
    truth, loaded, draft_engine
) -> None:
    """A whole T=0 draft loop by logits with the noisy draft, which disagrees
    with the target on some tokens: each round keeps exactly the draft's
    agreement with the target (rejections included), never the tokens the
    draft's own logits favour, and the output is the target's."""
    drafted, accepted, _, rejected = _draft_loop(truth, draft_engine, loaded["dte"], by_logits=True)
    assert rejected > 0 and 0 < accepted < drafted, (rejected, accepted, drafted)


def test_a_disagreeing_draft_with_its_own_logits_is_rejected_at_temperature_zero(
    truth, loaded
) -> None:
    """Draft tokens with draft logits that favour them (as a draft engine's
    would) but that differ from the target's argmax at one position: at T=0
    the target keeps the prefix before it and answers with its own token."""
    import torch

    prompt = PROMPTS[2]
    expected = truth(prompt, 5)
    vocab = loaded["dte"].config.vocab_size
    for agree in range(4):
        draft = [*expected[:agree], (expected[agree] + 1) % 384, *expected[agree + 1 : 4]]
        logits = torch.full((4, vocab), -10.0)
        logits[torch.arange(4), torch.tensor(draft)] = 10.0  # the draft is sure of each
        gen = loaded["dte"].generate(
            GenerationRequest(prompt, 5, draft_ids=draft, draft_logits=logits)
        )
        assert gen.output_ids == expected[: agree + 1], agree
        assert (gen.total_draft_tokens, gen.total_accepted_draft_tokens) == (4, agree)


def test_generation_logits_are_the_rows_tokens_were_picked_from(truth, loaded) -> None:
    import torch

    gen = loaded["none"].generate(GenerationRequest(PROMPTS[0], 6, return_generation_logits=True))
    assert len(gen.generation_logits) == 6
    picks = [int(torch.argmax(row)) for row in gen.generation_logits]
    assert picks == gen.output_ids == truth(PROMPTS[0], 6)
    assert loaded["none"].generate(GenerationRequest(PROMPTS[0], 6)).generation_logits == []


def test_bad_draft_logits_are_refused(loaded) -> None:
    import torch

    dte = loaded["dte"]
    with pytest.raises(RequestError) as err:
        dte.generate(
            GenerationRequest(PROMPTS[0], 3, draft_ids=[5, 6], draft_logits=torch.zeros(3, 384))
        )
    assert str(err.value) == (
        "draft_logits has shape [3, 384]; expected [2, 384] "
        "(one row of vocabulary logits per draft token)"
    )
    with pytest.raises(RequestError) as err:
        dte.generate(GenerationRequest(PROMPTS[0], 3, draft_logits=torch.zeros(2, 384)))
    assert str(err.value) == (
        "draft_logits given without draft_input_ids: the logits belong to the drafted tokens"
    )


def test_confidence_draft_loop_is_lossless_and_stops_where_the_draft_is_unsure(
    truth, loaded, draft_engine
) -> None:
    """draft_schedule confidence, in process as the orchestrator runs it (one
    draft call per token, ``speculate.draft_until_unsure``): greedy output is
    the target's token for token, and every round's draft is the draft's own
    greedy continuation cut after its first token below the threshold (checked
    against one plain k-token draft call with its logits)."""
    from trtspec.runtime.speculate import draft_until_unsure, token_probability

    cap, n = 6, 24
    probe = draft_engine.generate(GenerationRequest(PROMPTS[0], 12, return_generation_logits=True))
    seen = sorted(
        token_probability(row.numpy(), t, 0.0)
        for row, t in zip(probe.generation_logits, probe.output_ids, strict=True)
    )
    # a threshold inside the draft's own range, so some rounds stop early and some do not
    threshold = seen[len(seen) // 2]
    lengths = []
    for prompt in PROMPTS:
        seq = list(prompt)
        while len(seq) < len(prompt) + n:
            k = min(cap, len(prompt) + n - len(seq) - 1)

            def next_token(draft: list[int], seq: list[int] = seq) -> tuple[int, float] | None:
                gen = draft_engine.generate(
                    GenerationRequest([*seq, *draft], 1, return_generation_logits=True)
                )
                if not gen.output_ids:
                    return None
                token = gen.output_ids[0]
                return token, token_probability(gen.generation_logits[0].numpy(), token, 0.0)

            draft = draft_until_unsure(next_token, k, threshold) if k > 0 else []
            if k > 0:
                whole = draft_engine.generate(
                    GenerationRequest(seq, k, return_generation_logits=True)
                )
                probs = [
                    token_probability(row.numpy(), t, 0.0)
                    for row, t in zip(whole.generation_logits, whole.output_ids, strict=True)
                ]
                unsure = next((i for i, p in enumerate(probs) if p < threshold), k - 1)
                assert draft == whole.output_ids[: unsure + 1]
                lengths.append(len(draft))
            gen = loaded["dte"].generate(
                GenerationRequest(seq, len(draft) + 1, draft_ids=draft or None)
            )
            seq += gen.output_ids
        assert seq[len(prompt) :] == truth(prompt, n)
    assert 1 in lengths and max(lengths) > 1, lengths  # the threshold decided the lengths
