"""Token selection: how the target "picks" its token at a verified position.

Every mode shares one acceptance rule: at each verified position the target
picks its own token (argmax at temperature 0, otherwise one draw from its
temperature / top-k / top-p distribution using the request's seeded
``torch.Generator``), and a draft token is accepted iff it equals that pick.
Because each pick is drawn from the target's exact conditional distribution
given the accepted prefix, speculative output is distributed exactly like
target-only sampling at any temperature.

A request that carries the draft's own logits (``draft_logits``, TRT-LLM's
accept-by-logits path) is verified by speculative sampling instead
(Leviathan et al. 2023; TRT-LLM's ``acceptDraftTokensByLogits``): the draft
token ``d`` drawn from the draft's distribution ``q`` is kept with probability
``min(1, p(d) / q(d))``; on rejection the target's token is drawn from the
normalised residual ``max(0, p - q)``. The output is again distributed exactly
like ``p``, and a token is kept more often than by matching (on average
``sum(min(p, q))`` against ``sum(p * q)``). Those draws come from a second
generator seeded apart from the request's, so they are independent of the
draws that picked the draft (the draft engine was given the same seed).
Parameter conventions follow TRT-LLM:
``top_k == 0`` and ``top_p`` outside (0, 1) mean "off"; temperature 0,
``top_k == 1``, or ``top_k == 0`` together with ``top_p == 0`` mean greedy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p == 0.0)


# Mixed into the seed of the speculative-sampling generator (any odd 64-bit
# constant works; this is the golden-ratio one splitmix64 uses).
_ACCEPT_SEED_MIX = 0x9E3779B97F4A7C15


class Sampler:
    """Picks tokens from logits for one request (owns its generators)."""

    def __init__(self, params: SamplingParams) -> None:
        import torch

        self.params = params
        self.generator: Any = None
        self._accept_generator: Any = None
        if not params.greedy:
            self.generator = torch.Generator().manual_seed(int(params.seed) & ((1 << 63) - 1))

    def probs(self, logits: Any) -> Any:
        """The target's sampling distribution for 1-D ``logits`` (float32)."""
        import torch

        p = self.params
        x = logits.float() / max(p.temperature, 1e-6)
        if p.top_k > 0 and p.top_k < x.shape[-1]:
            kth = torch.topk(x, p.top_k).values[-1]
            x = x.masked_fill(x < kth, float("-inf"))
        probs = torch.softmax(x, dim=-1)
        if 0.0 < p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            cum = torch.cumsum(sorted_p, dim=-1)
            # keep the smallest prefix whose mass reaches top_p (always >= 1 token)
            drop = (cum - sorted_p) >= p.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
            probs = probs / probs.sum()
        return probs

    def pick(self, logits: Any) -> int:
        import torch

        if self.params.greedy:
            return int(torch.argmax(logits).item())
        return int(torch.multinomial(self.probs(logits), 1, generator=self.generator).item())

    def _accept_gen(self) -> Any:
        import torch

        if self._accept_generator is None:
            seed = (int(self.params.seed) * _ACCEPT_SEED_MIX + 1) & ((1 << 63) - 1)
            self._accept_generator = torch.Generator().manual_seed(seed)
        return self._accept_generator

    def accept_by_logits(self, target_logits: Any, draft_logits: Any, token: int) -> int | None:
        """Speculative sampling of one drafted position: ``None`` if ``token`` is
        kept, else the target's replacement token (from the residual).

        Greedy requests reduce to matching: ``p`` is one-hot on the argmax, so
        the draft is kept iff it is the argmax and the residual is the argmax."""
        import torch

        if self.params.greedy:
            pick = int(torch.argmax(target_logits).item())
            return None if pick == token else pick
        p = self.probs(target_logits)
        q = self.probs(draft_logits)
        gen = self._accept_gen()
        p_tok, q_tok = float(p[token]), float(q[token])
        if q_tok <= 0.0:
            # Not a token the draft could have sampled with these parameters
            # (it drafted greedily, say): fall back to matching, still lossless.
            pick = int(torch.multinomial(p, 1, generator=gen).item())
            return None if pick == token else pick
        u = float(torch.rand(1, generator=gen).item())
        if u < min(1.0, p_tok / q_tok):
            return None
        residual = torch.clamp(p - q, min=0.0)
        total = float(residual.sum())
        dist = residual / total if total > 0.0 else p
        return int(torch.multinomial(dist, 1, generator=gen).item())

    def pick_independent(self, logits: Any) -> int:
        """``pick`` from the speculative-sampling generator (the bonus token
        after a fully kept draft, drawn apart from the draft's own stream)."""
        import torch

        if self.params.greedy:
            return int(torch.argmax(logits).item())
        return int(torch.multinomial(self.probs(logits), 1, generator=self._accept_gen()).item())
