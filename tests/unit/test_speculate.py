"""trtspec.runtime.speculate: prompt lookup, draft budget, the draft-length schedule,
acceptance counting and the offline replay of the draft → verify loop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trtspec.runtime.speculate import (
    DEFAULT_CONFIDENCE_THRESHOLD,
    DRAFT_SCHEDULES,
    DraftSchedule,
    RoundStats,
    accepted_count,
    draft_budget,
    draft_until_unsure,
    propose_ngram,
    round_finished,
    simulate_rounds,
)


def test_longest_suffix_match_proposes_following_tokens() -> None:
    # suffix [2, 3] occurs at 1; the tokens after it are 4, 5, 6
    assert propose_ngram([1, 2, 3, 4, 5, 6, 9, 2, 3], k=3, max_matching_ngram_size=2) == [4, 5, 6]


def test_proposal_is_capped_at_k_and_at_the_sequence_end() -> None:
    seq = [7, 8, 9, 7, 8]
    assert propose_ngram(seq, k=5, max_matching_ngram_size=2) == [9, 7, 8]
    assert propose_ngram(seq, k=1, max_matching_ngram_size=2) == [9]


def test_oldest_occurrence_wins() -> None:
    # [5] occurs at 0 (followed by 1) and at 2 (followed by 2): the oldest is used
    assert propose_ngram([5, 1, 5, 2, 5], k=1, max_matching_ngram_size=1) == [1]


def test_longer_ngram_preferred_over_shorter() -> None:
    # 1-gram [3] first occurs at 0 (-> 9), but the 2-gram [4, 3] occurs at 3 (-> 7)
    seq = [3, 9, 0, 4, 3, 7, 1, 4, 3]
    assert propose_ngram(seq, k=1, max_matching_ngram_size=2) == [7]
    assert propose_ngram(seq, k=1, max_matching_ngram_size=1) == [9]


def test_no_match_or_no_budget_proposes_nothing() -> None:
    assert propose_ngram([1, 2, 3, 4], k=4, max_matching_ngram_size=3) == []
    assert propose_ngram([1, 1, 1], k=0, max_matching_ngram_size=3) == []
    assert propose_ngram([], k=3, max_matching_ngram_size=3) == []
    assert propose_ngram([5], k=3, max_matching_ngram_size=3) == []


@given(st.lists(st.integers(0, 4), max_size=40), st.integers(0, 6), st.integers(1, 4))
def test_proposal_always_continues_an_earlier_occurrence(seq: list[int], k: int, n: int) -> None:
    draft = propose_ngram(seq, k, n)
    assert len(draft) <= k
    if draft:
        # some earlier window equal to a suffix is followed by exactly the draft
        found = any(
            seq[s : s + m] == seq[len(seq) - m :] and seq[s + m : s + m + len(draft)] == draft
            for m in range(1, n + 1)
            for s in range(0, len(seq) - m)
        )
        assert found


def test_draft_budget_leaves_room_for_the_verifier_token() -> None:
    assert draft_budget(4, 8, remaining=10) == 4
    assert draft_budget(9, 8, remaining=10) == 8
    assert draft_budget(4, 8, remaining=3) == 2
    assert draft_budget(4, 8, remaining=1) == 0


def test_accepted_count_is_the_common_prefix() -> None:
    assert accepted_count([1, 2, 3], [1, 2, 9]) == 2
    assert accepted_count([1, 2, 3], [1, 2, 3, 4]) == 3
    assert accepted_count([], [5]) == 0
    assert accepted_count([1, 2], [7, 1]) == 0


def test_round_finished_on_end_token_or_short_reply() -> None:
    assert round_finished([1, 2], [1, 2, 3], end_id=0) is False
    assert round_finished([1, 2], [1, 0], end_id=0) is True
    # the verifier stopped after one accepted token without its own extra token
    assert round_finished([1, 2], [1], end_id=0) is True
    assert round_finished([], [], end_id=0) is True


def test_round_stats_totals_and_rejects_impossible_rounds() -> None:
    stats = RoundStats()
    stats.record(4, 3)
    stats.record(0, 0)
    assert (stats.rounds, stats.draft_tokens, stats.accepted_tokens) == (2, 4, 3)
    assert stats.acceptance_rate == 0.75
    with pytest.raises(ValueError, match="accepted 5 of 4 drafted tokens"):
        stats.record(4, 5)


@pytest.mark.parametrize("schedule", ["constant", "adaptive"])
def test_simulation_with_a_perfect_drafter_accepts_everything(schedule: str) -> None:
    output = list(range(100, 120))
    prompt = [1, 2, 3]

    def oracle(seq: list[int], k: int) -> list[int]:
        pos = len(seq) - len(prompt)
        return output[pos : pos + k]

    stats = simulate_rounds(
        prompt,
        output,
        oracle,
        num_draft_tokens=4,
        max_draft_len=4,
        max_tokens=20,
        schedule=schedule,
    )
    # rounds of 4 drafted + 1 own token: 5 tokens per round; adaptive keeps the cap
    assert stats.per_round == [(4, 4), (4, 4), (4, 4), (4, 4)]


def test_simulation_with_ngram_counts_exactly() -> None:
    prompt = [1, 2, 3, 4, 1, 2]
    output = [3, 4, 9, 9, 1, 2, 3]
    stats = simulate_rounds(
        prompt,
        output,
        lambda s, k: propose_ngram(s, k, 2),
        num_draft_tokens=3,
        max_draft_len=4,
        max_tokens=7,
    )
    # round 1: suffix [1, 2] -> draft [3, 4, 1]; target 3, 4, 9: 2 accepted, 3 tokens
    # round 2: suffix [4, 9] unseen, [9] unseen -> no draft; 1 token (9)
    # round 3: 3 tokens left, k=2: suffix [9, 9] unseen, [9] at 8 -> draft [9]; target 1
    # round 4: 2 tokens left, k=1: [1] first at 0 -> draft [2]; target 2, 3 -> done
    assert stats.per_round == [(3, 2), (0, 0), (1, 0), (1, 1)]
    assert stats.rounds == 4


def test_constant_schedule_never_changes() -> None:
    schedule = DraftSchedule(4)
    assert schedule.kind == "constant"
    for drafted, accepted in [(4, 0), (4, 4), (0, 0), (4, 1), (2, 2)]:
        schedule.update(drafted, accepted)
        assert schedule.next() == 4


def test_adaptive_schedule_shrinks_to_one_and_grows_back_to_the_cap() -> None:
    schedule = DraftSchedule(5, "adaptive")
    assert schedule.next() == 5
    lengths = []
    for _ in range(6):  # every round rejects: 5 -> 4 -> 3 -> 2 -> 1, floored at 1
        schedule.update(schedule.next(), 0)
        lengths.append(schedule.next())
    assert lengths == [4, 3, 2, 1, 1, 1]
    schedule.update(1, 1)  # fully accepted: +2
    assert schedule.next() == 3
    schedule.update(3, 2)  # a rejection after two accepted: -1
    assert schedule.next() == 2
    schedule.update(2, 2)
    schedule.update(4, 4)
    assert schedule.next() == 5  # 2 + 2 + 2 capped at 5
    schedule.update(5, 5)
    assert schedule.next() == 5


def test_adaptive_schedule_ignores_rounds_without_a_draft() -> None:
    schedule = DraftSchedule(4, "adaptive")
    schedule.update(4, 1)
    assert schedule.next() == 3
    schedule.update(0, 0)  # an n-gram miss: nothing was drafted
    assert schedule.next() == 3


def test_draft_schedule_rejects_unknown_kinds_and_negative_caps() -> None:
    assert DRAFT_SCHEDULES == ("constant", "adaptive", "confidence")
    with pytest.raises(
        ValueError, match="draft schedule 'heuristic' is not one of constant, adaptive, confidence"
    ):
        DraftSchedule(4, "heuristic")
    with pytest.raises(ValueError, match="draft length cap -1 is negative"):
        DraftSchedule(-1, "adaptive")
    for bad in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(ValueError, match=f"draft confidence threshold {bad} is not between"):
            DraftSchedule(4, "confidence", bad)
    assert DraftSchedule(0, "adaptive").next() == 0


def test_confidence_schedule_keeps_its_cap_and_drafts_stepwise() -> None:
    schedule = DraftSchedule(6, "confidence")
    assert schedule.stepwise and not DraftSchedule(6, "adaptive").stepwise
    assert schedule.threshold == DEFAULT_CONFIDENCE_THRESHOLD == 0.4
    for drafted, accepted in [(6, 0), (2, 2), (0, 0), (1, 0)]:
        schedule.update(drafted, accepted)
        assert schedule.next() == 6  # the cap; the stop comes from the draft's confidence


def _scripted(steps: list[tuple[int, float] | None]):
    """A ``next_token`` that answers ``steps`` in order and records each draft it saw."""
    seen: list[list[int]] = []

    def next_token(draft: list[int]) -> tuple[int, float] | None:
        seen.append(list(draft))
        return steps[len(seen) - 1]

    return next_token, seen


def test_draft_until_unsure_keeps_the_first_unsure_token_and_stops() -> None:
    # Hugging Face's ConfidenceCriteria: the token below the threshold is
    # generated (kept) and the draft stops after it
    next_token, seen = _scripted([(11, 0.9), (12, 0.41), (13, 0.39), (14, 0.99)])
    assert draft_until_unsure(next_token, 10, 0.4) == [11, 12, 13]
    assert seen == [[], [11], [11, 12]]  # each call sees the draft so far
    # exactly at the threshold is confident (HF stops on p < threshold)
    next_token, _ = _scripted([(11, 0.4), (12, 0.1)])
    assert draft_until_unsure(next_token, 10, 0.4) == [11, 12]


def test_draft_until_unsure_stops_at_the_cap_and_at_the_drafts_end() -> None:
    next_token, seen = _scripted([(1, 0.99)] * 5)
    assert draft_until_unsure(next_token, 3, 0.4) == [1, 1, 1]
    assert len(seen) == 3  # no call past the cap
    next_token, seen = _scripted([(5, 0.9), None, (6, 0.9)])
    assert draft_until_unsure(next_token, 8, 0.4) == [5]  # None: the draft's end token
    assert draft_until_unsure(_scripted([])[0], 0, 0.4) == []  # no budget, no call
    next_token, _ = _scripted([(7, 0.05)])
    assert draft_until_unsure(next_token, 8, 0.4) == [7]  # unsure at once: one token


def test_draft_call_seeds_are_distinct_from_each_other_and_from_round_seeds() -> None:
    from trtspec.runtime.speculate import draft_call_seed, round_seed

    base = round_seed(7, 3, 0)
    assert draft_call_seed(base, 0) == base  # the first call keeps the round's seed
    calls = [draft_call_seed(base, j) for j in range(64)]
    rounds = {round_seed(7, r, role) for r in range(200) for role in (0, 1)}
    assert len(set(calls)) == 64 and all(0 <= s < 1 << 64 for s in calls)
    assert not set(calls[1:]) & rounds
    assert draft_call_seed(base, 5) == draft_call_seed(base, 5) != draft_call_seed(base + 1, 5)


def test_adaptive_simulation_with_a_wrong_drafter_drafts_one_token_per_round() -> None:
    output = list(range(100, 120))

    def wrong(seq: list[int], k: int) -> list[int]:
        return [7] * k  # never in the output

    stats = simulate_rounds(
        [1, 2],
        output,
        wrong,
        num_draft_tokens=4,
        max_draft_len=4,
        max_tokens=12,
        schedule="adaptive",
    )
    # every round keeps only the verifier's own token; k goes 4, 3, 2, 1, 1, ...
    # (the last round has one token left, all of it the verifier's)
    assert stats.per_round == [(4, 0), (3, 0), (2, 0), *[(1, 0)] * 8, (0, 0)]
    constant = simulate_rounds(
        [1, 2], output, wrong, num_draft_tokens=4, max_draft_len=4, max_tokens=12
    )
    # the remaining budget still caps k near the end (room for the verifier's token)
    assert constant.per_round == [(4, 0)] * 8 + [(3, 0), (2, 0), (1, 0), (0, 0)]
    assert stats.rounds == constant.rounds == 12


def test_adaptive_simulation_recovers_after_a_rejection() -> None:
    output = list(range(100, 130))
    prompt = [1, 2, 3]

    def mostly_right(seq: list[int], k: int) -> list[int]:
        pos = len(seq) - len(prompt)
        draft = output[pos : pos + k]
        # one wrong token at output position 2 (the first round's third draft)
        return [7 if pos + i == 2 else t for i, t in enumerate(draft)]

    stats = simulate_rounds(
        prompt,
        output,
        mostly_right,
        num_draft_tokens=6,
        max_draft_len=8,
        max_tokens=30,
        schedule="adaptive",
    )
    # round 1: 6 drafted, 2 accepted (+1 own) -> k 5; then all accepted -> k 6 (capped)
    assert stats.per_round[:3] == [(6, 2), (5, 5), (6, 6)]


def test_round_seeds_differ_per_round_and_role() -> None:
    from trtspec.runtime.speculate import round_seed

    seeds = {round_seed(7, r, role) for r in range(50) for role in (0, 1)}
    assert len(seeds) == 100 and all(0 <= s < 1 << 64 for s in seeds)
    assert round_seed(7, 0, 0) == round_seed(7, 0, 0) != round_seed(8, 0, 0)
    assert round_seed(0, 0, 0) == 0x9E3779B97F4A7C15
