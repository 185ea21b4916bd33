"""Pure speculative-decoding bookkeeping shared by the orchestrator model, the
benchmark and the tests: the n-gram prompt-lookup proposer (TensorRT-LLM's
prompt-lookup semantics: the longest suffix of up to ``max_matching_ngram_size``
tokens is looked up in the earlier prompt + output, the oldest occurrence wins,
and the up-to-``k`` tokens that followed it are proposed), the per-round draft
budget, the draft-length schedule (constant, adaptive like Hugging Face's
``num_assistant_tokens_schedule="heuristic"``, or confidence-driven like its
``assistant_confidence_threshold``), the count of accepted draft
tokens from a verifier's reply, and an offline simulation of the draft →
verify loop against a known greedy output.
No Triton, torch or numpy at import: the orchestrator imports this inside a Python
backend stub and the engine engineer may import it from a benchmark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


def propose_ngram(tokens: Sequence[int], k: int, max_matching_ngram_size: int) -> list[int]:
    """Prompt-lookup draft: up to ``k`` tokens that followed the earliest earlier
    occurrence of the longest matching suffix (length ``max_matching_ngram_size``
    down to 1). Returns ``[]`` when nothing matches or ``k <= 0``."""
    if k <= 0 or max_matching_ngram_size <= 0:
        return []
    seq = list(tokens)
    length = len(seq)
    for n in range(min(max_matching_ngram_size, length - 1), 0, -1):
        pattern = seq[length - n :]
        # A match must start before the suffix itself and leave at least one
        # following token to propose.
        for start in range(0, length - n):
            if seq[start : start + n] == pattern:
                follow = seq[start + n : start + n + k]
                if follow:
                    return follow
    return []


def draft_budget(num_draft_tokens: int, max_draft_len: int, remaining: int) -> int:
    """How many tokens to draft this round. The verifier returns the accepted
    draft plus one token of its own, so the draft must leave room for it
    within the ``remaining`` output budget (the upstream BLS rule)."""
    return max(0, min(num_draft_tokens, max_draft_len, remaining - 1))


DRAFT_SCHEDULES = ("constant", "adaptive", "confidence")
#: Hugging Face's default ``assistant_confidence_threshold`` (transformers 5.x,
#: generation/configuration_utils.py: ``"assistant_confidence_threshold": 0.4``
#: beside ``num_assistant_tokens: 20``, ``num_assistant_tokens_schedule:
#: "constant"``).
DEFAULT_CONFIDENCE_THRESHOLD = 0.4


class DraftSchedule:
    """How many tokens to draft next round, for one request.

    ``constant`` drafts ``cap`` tokens every round (TensorRT-LLM's BLS with a
    fixed ``num_draft_tokens``). ``adaptive`` starts at ``cap``; a round whose
    whole draft was accepted raises k by 2 (never above ``cap``), a round with
    a rejection lowers it by 1 (never below 1), a round with no draft (an
    n-gram miss) leaves it alone. Verifying k tokens is nearly free on a GPU
    but not on a CPU, and a run of rejections then costs more than it saves.
    ``confidence`` drafts up to ``cap`` tokens a round but stops after the
    first token the draft itself gave a probability below ``threshold``
    (:func:`draft_until_unsure`; Hugging Face's default assistant schedule).
    The schedule is the orchestrator's policy and never changes the output."""

    def __init__(
        self, cap: int, kind: str = "constant", threshold: float = DEFAULT_CONFIDENCE_THRESHOLD
    ) -> None:
        if kind not in DRAFT_SCHEDULES:
            raise ValueError(f"draft schedule {kind!r} is not one of {', '.join(DRAFT_SCHEDULES)}")
        if cap < 0:
            raise ValueError(f"draft length cap {cap} is negative")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"draft confidence threshold {threshold} is not between 0 and 1")
        self.cap = cap
        self.kind = kind
        self.threshold = threshold
        self.k = cap

    @property
    def stepwise(self) -> bool:
        """Whether the draft is taken one token at a time (``draft_until_unsure``)."""
        return self.kind == "confidence"

    def next(self) -> int:
        return self.k

    def update(self, drafted: int, accepted: int) -> None:
        if self.kind != "adaptive" or drafted <= 0:
            return
        if accepted >= drafted:
            self.k = min(self.cap, self.k + 2)
        else:
            self.k = max(1, self.k - 1)


def draft_until_unsure(
    next_token: Callable[[list[int]], tuple[int, float] | None], cap: int, threshold: float
) -> list[int]:
    """A confidence-driven draft: ask ``next_token(draft so far)`` for the
    draft's next token and its own probability of it, at most ``cap`` times,
    and stop after the first token whose probability is below ``threshold``
    (that token stays in the draft) or when the draft has no next token (its
    end token). This is Hugging Face's ``ConfidenceCriteria`` (transformers
    5.x, generation/stopping_criteria.py: the assistant stops once
    ``probs[last token] < assistant_confidence_threshold``, keeping the token)
    without its ROC re-tuning of the threshold, which needs scikit-learn and
    is not part of its documented default. A TensorRT-LLM draft engine has no
    such stop, so the draft is taken one engine call per token (each call
    reuses the previous call's KV cache, so it encodes one new token)."""
    draft: list[int] = []
    while len(draft) < cap:
        got = next_token(draft)
        if got is None:
            break
        token, probability = got
        draft.append(token)
        if probability < threshold:
            break
    return draft


def token_probability(row: Any, token: int, temperature: float | None) -> float:
    """The probability a logits ``row`` (a float array over the vocabulary)
    gives ``token``: its softmax, divided by ``temperature`` when sampling (the
    distribution the draft drew from, before top-k/top-p), as Hugging Face's
    ``ConfidenceCriteria`` reads the assistant's processed scores. numpy is
    imported here, on call, so this module stays import-free for the stubs."""
    import numpy as np

    x = np.asarray(row, dtype=np.float64)
    if temperature is not None and temperature > 0:
        x = x / temperature
    e = np.exp(x - x.max())
    return float(e[token] / e.sum())


_SEED_STEP = 0x9E3779B97F4A7C15  # splitmix64's increment: distinct, well spread seeds


def round_seed(seed: int, round_index: int, role: int) -> int:
    """The sampling seed of one engine call in a draft → verify loop at T > 0.

    Every call is a new engine request, and an engine seeds its generator from
    the request's seed; one seed for every call would replay the same random
    draws in every round (and in the draft and the target alike), so the
    tokens of different rounds would be correlated and the output would not
    be distributed like target-only sampling. ``role`` 0 is the draft call,
    1 the target call; the result is a uint64."""
    return (seed + (2 * round_index + role + 1) * _SEED_STEP) % (1 << 64)


def draft_call_seed(draft_seed: int, call: int) -> int:
    """The seed of the ``call``-th draft engine call within one round (0: the
    round's own draft seed, :func:`round_seed`). A confidence-driven draft
    calls the engine once per token, and one seed for all of them would draw
    the same random number at every position of the draft; later calls get
    splitmix64's output for ``draft_seed + call·step``, which no round seed
    (a linear sequence) repeats in practice."""
    if call == 0:
        return draft_seed
    z = (draft_seed + call * _SEED_STEP) % (1 << 64)
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % (1 << 64)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % (1 << 64)
    return z ^ (z >> 31)


def accepted_count(draft: Sequence[int], verified: Sequence[int]) -> int:
    """Draft tokens the verifier kept: the common prefix of the draft and the
    tokens the verifier returned for this round (accepted prefix + one)."""
    n = 0
    for proposed, kept in zip(draft, verified, strict=False):
        if proposed != kept:
            break
        n += 1
    return n


def round_finished(draft: Sequence[int], verified: Sequence[int], end_id: int | None) -> bool:
    """Whether the verifier stopped the sequence this round: it returned fewer
    tokens than accepted + 1 (it hit the end token, excluded from its output)
    or returned the end token itself."""
    if not verified:
        return True
    if end_id is not None and end_id in verified:
        return True
    return len(verified) < accepted_count(draft, verified) + 1


@dataclass
class RoundStats:
    """Running totals of a draft → verify loop; one ``record`` per target call."""

    rounds: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    per_round: list[tuple[int, int]] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        if accepted > drafted or accepted < 0:
            raise ValueError(f"accepted {accepted} of {drafted} drafted tokens")
        self.rounds += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        self.per_round.append((drafted, accepted))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0


def position_counts(per_round: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Per draft position j = 1, 2, …: how many rounds drafted a token at j
    and how many of those had it accepted (a round's accepted tokens are a
    prefix of its draft, so position j is accepted when ``accepted ≥ j``)."""
    width = max((d for d, _ in per_round), default=0)
    drafted = [sum(1 for d, _ in per_round if d > j) for j in range(width)]
    accepted = [sum(1 for _, a in per_round if a > j) for j in range(width)]
    return drafted, accepted


Proposer = Callable[[Sequence[int], int], list[int]]


def simulate_rounds(
    prompt: Sequence[int],
    greedy_output: Sequence[int],
    propose: Proposer,
    *,
    num_draft_tokens: int,
    max_draft_len: int,
    max_tokens: int,
    schedule: str = "constant",
) -> RoundStats:
    """Replay the draft → verify loop offline against the target's greedy
    output (what the verifier returns at temperature 0) and count exactly what
    the orchestrator should report. ``propose(sequence, k)`` is the drafter;
    ``schedule`` is the draft-length schedule (``DraftSchedule``)."""
    stats = RoundStats()
    lengths = DraftSchedule(num_draft_tokens, schedule)
    target = list(greedy_output)
    seq = list(prompt)
    pos = 0
    while pos < len(target) and pos < max_tokens:
        k = draft_budget(lengths.next(), max_draft_len, max_tokens - pos)
        draft = list(propose(seq, k))[:k] if k > 0 else []
        accepted = accepted_count(draft, target[pos:])
        kept = target[pos : pos + accepted + 1]
        stats.record(len(draft), accepted)
        lengths.update(len(draft), accepted)
        seq.extend(kept)
        pos += len(kept)
    return stats
