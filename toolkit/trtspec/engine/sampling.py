"""Token selection: how the target "picks" its token at a verified position.

Every mode shares one acceptance rule: at each verified position the target
picks its own token (argmax at temperature 0, otherwise one draw from its
temperature / top-k / top-p distribution using the request's seeded
``torch.Generator``), and a draft token is accepted iff it equals that pick.
Because each pick is drawn from the target's exact conditional distribution
given the accepted prefix, speculative output is distributed exactly like
target-only sampling at any temperature. Parameter conventions follow TRT-LLM:
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
        return (self.temperature <= 0.0 or self.top_k == 1
                or (self.top_k == 0 and self.top_p == 0.0))


class Sampler:
    """Picks tokens from logits for one request (owns its generator)."""

    def __init__(self, params: SamplingParams) -> None:
        import torch

        self.params = params
        self.generator: Any = None
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
