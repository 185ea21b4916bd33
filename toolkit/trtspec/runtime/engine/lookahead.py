"""Lookahead decoding state: the Jacobi window and the n-gram pool (TRT-LLM semantics).

Per request: a lookahead branch of ``N-1`` rows × ``W`` columns of guess
tokens, and a pool of n-grams keyed by their first token holding at most ``G``
continuations per key (most recent kept). Each step the engine feeds, after
the last committed token ("root"), (a) the verification branch: up to ``G``
pool n-grams whose key is the root token, as chains of ``N-1`` tokens, and
(b) the lookahead branch, where token (r, c) sits at depth ``r + c + 1`` and
attends to row 0 columns ``<= c`` then column c rows ``1..r`` (a causal
sequence of consecutive positions). The last row's outputs are new guesses:
column c yields the n-gram ``rows[0..N-2][c] + out[c]``, which enters the pool,
and the window shifts up one row. The pool is seeded with the prompt's
n-grams and, as tokens are committed, with the output's. Only verification
decides what is emitted, so the branch's guesses affect speed, never output.
"""

from __future__ import annotations

import random
from collections import OrderedDict


class LookaheadState:
    def __init__(self, window: int, ngram: int, verification: int, prompt: list[int]) -> None:
        self.W, self.N, self.G = window, ngram, verification
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = {}
        rng = random.Random(len(prompt))  # deterministic, independent of the request seed
        source = prompt or [0]
        self.rows: list[list[int]] = [
            [source[rng.randrange(len(source))] for _ in range(self.W)]
            for _ in range(max(self.N - 1, 0))
        ]
        self._indexed = 0
        self.observe(prompt)

    @property
    def active(self) -> bool:
        return self.N >= 2

    def _add(self, gram: tuple[int, ...]) -> None:
        if self.G <= 0 or len(gram) != self.N:
            return
        bucket = self.pool.setdefault(gram[0], OrderedDict())
        tail = gram[1:]
        bucket.pop(tail, None)
        bucket[tail] = None
        while len(bucket) > self.G:
            bucket.popitem(last=False)

    def observe(self, sequence: list[int]) -> None:
        """Add the n-grams of newly committed tokens of ``sequence`` to the pool."""
        start = max(self._indexed - self.N + 1, 0)
        for i in range(start, len(sequence) - self.N + 1):
            self._add(tuple(sequence[i : i + self.N]))
        self._indexed = len(sequence)

    def candidates(self, root: int) -> list[tuple[int, ...]]:
        """Up to G continuations (N-1 tokens each) for ``root``, most recent first."""
        bucket = self.pool.get(root)
        if not bucket:
            return []
        return list(reversed(bucket.keys()))[: self.G]

    def branch(self) -> tuple[list[int], list[int], list[list[int]]]:
        """Lookahead-branch (tokens, depths, attended branch indices) in row-major order."""
        tokens: list[int] = []
        depths: list[int] = []
        attend: list[list[int]] = []
        rows, W = len(self.rows), self.W

        def idx(r: int, c: int) -> int:
            return r * W + c

        for r in range(rows):
            for c in range(W):
                tokens.append(self.rows[r][c])
                depths.append(r + c + 1)
                seen = [idx(0, j) for j in range(c + 1)] + [idx(i, c) for i in range(1, r + 1)]
                attend.append(seen)
        return tokens, depths, attend

    def advance(self, last_row_outputs: list[int]) -> None:
        """Collect the column n-grams, then shift the window by one row."""
        if not self.rows:
            return
        for c in range(self.W):
            column = [row[c] for row in self.rows]
            self._add((*column, last_row_outputs[c]))
        self.rows = [*self.rows[1:], list(last_row_outputs)]
