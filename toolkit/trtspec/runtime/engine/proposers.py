"""The reference engine's draft proposers: one class per engine mode that
drafts inside the engine, found through ``PROPOSERS`` by the engine's mode.

The decode loop (``decode.ReferenceEngine._loop``) makes one proposer per
request and asks it, every step, for a draft tree (node tokens and parent
indices, -1 = the root) to verify; a mode that runs extra rows beside the
tree (lookahead's branch) returns them from ``branch`` and reads their
logits back in ``advance``; ``observe`` sees the committed sequence after
each step. The base ``Proposer`` drafts nothing: the baseline engine, and a
``draft_tokens_external`` engine, whose drafts arrive with each request
(``GenerationRequest.draft_ids``, handled by the loop for any engine).

The tree builders themselves (``_propose_medusa``, ``_propose_eagle``,
``_lookahead_candidates``) stay on the engine, which owns the heads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.runtime.engine.kv_reuse import make_cache
from trtspec.runtime.engine.lookahead import LookaheadState

if TYPE_CHECKING:
    from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine

Tree = tuple[list[int], list[int]]  # node tokens, parent index per node (-1 = root)
# Extra rows: tokens, depths, attended rows (relative to the first extra row),
# and which of them need logits (relative likewise).
Branch = tuple[list[int], list[int], list[list[int]], list[int]]


class Proposer:
    """Drafts nothing itself (baseline and ``draft_tokens_external`` engines)."""

    #: Whether the loop keeps the hidden states of committed positions (EAGLE's input).
    needs_features = False

    def __init__(self, engine: ReferenceEngine, req: GenerationRequest, prompt: list[int]) -> None:
        self.engine = engine

    def propose(
        self, committed: list[int], root: int, feats: Any, root_hidden: Any, budget: int
    ) -> Tree:
        """The draft tree after ``root`` (the last pending token), at most ``budget`` deep."""
        return [], []

    def branch(self) -> Branch | None:
        """Rows run beside the tree this step, or None."""
        return None

    def advance(self, branch_logits: Any) -> None:
        """The logits of the rows ``branch`` asked for."""

    def observe(self, committed: list[int], bonus: int) -> None:
        """The committed sequence and this step's bonus token, after each step."""


class MedusaProposer(Proposer):
    """Medusa heads on the hidden state of the row that picked the root."""

    def propose(
        self, committed: list[int], root: int, feats: Any, root_hidden: Any, budget: int
    ) -> Tree:
        if self.engine.medusa_tree and root_hidden is not None and budget > 0:
            return self.engine._propose_medusa(root_hidden, budget)
        return [], []


class EagleProposer(Proposer):
    """EAGLE-1 draft trees; keeps the EAGLE layer's own KV cache across steps."""

    def __init__(self, engine: ReferenceEngine, req: GenerationRequest, prompt: list[int]) -> None:
        super().__init__(engine, req, prompt)
        self.needs_features = engine.eagle is not None
        # the EAGLE layer is a transformers LlamaModel: it needs a DynamicCache
        self.cache = make_cache(hf=True) if self.needs_features else None
        self.fed = 0

    def propose(
        self, committed: list[int], root: int, feats: Any, root_hidden: Any, budget: int
    ) -> Tree:
        if not self.needs_features or feats is None or budget <= 0:
            return [], []
        nodes, parents, self.cache, self.fed = self.engine._propose_eagle(
            committed, root, feats, self.cache, fed=self.fed, budget=budget
        )
        return nodes, parents


class LookaheadProposer(Proposer):
    """Jacobi lookahead: pool n-grams verified as a trie, the branch run beside them."""

    def __init__(self, engine: ReferenceEngine, req: GenerationRequest, prompt: list[int]) -> None:
        super().__init__(engine, req, prompt)
        self.state: LookaheadState | None = None
        if engine.lookahead is not None:
            w, n, g = req.lookahead or engine.lookahead
            self.state = LookaheadState(w, n, g, prompt)

    def propose(
        self, committed: list[int], root: int, feats: Any, root_hidden: Any, budget: int
    ) -> Tree:
        if self.state is None or budget <= 0:
            return [], []
        return self.engine._lookahead_candidates(self.state, root, budget)

    def branch(self) -> Branch | None:
        if self.state is None or not self.state.active:
            return None
        tokens, depths, attend = self.state.branch()
        last = (len(self.state.rows) - 1) * self.state.W  # the branch's last row
        return tokens, depths, attend, list(range(last, last + self.state.W))

    def advance(self, branch_logits: Any) -> None:
        import torch

        assert self.state is not None
        self.state.advance(torch.argmax(branch_logits, dim=-1).tolist())

    def observe(self, committed: list[int], bonus: int) -> None:
        if self.state is not None:
            self.state.observe([*committed, bonus])


#: The proposer of each engine mode (``trtspec.catalogue.ENGINE_MODES`` names);
#: the completeness test holds every reference-runnable mode to an entry.
PROPOSERS: dict[str, type[Proposer]] = {
    "none": Proposer,
    "draft_tokens_external": Proposer,
    "medusa": MedusaProposer,
    "eagle": EagleProposer,
    "lookahead": LookaheadProposer,
}


def proposer_for(engine: ReferenceEngine, req: GenerationRequest, prompt: list[int]) -> Proposer:
    """A fresh proposer for one request on ``engine``."""
    return PROPOSERS[engine.config.mode](engine, req, prompt)
