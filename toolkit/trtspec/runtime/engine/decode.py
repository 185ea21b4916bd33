"""The reference engine: KV-cached decoding and every speculative mode, in torch.

``ReferenceEngine.load(engine_dir)`` reads a reference engine folder and
serves requests in process (tests, benchmarks) or behind Triton
(``triton_model.py``). One step loop drives all modes: the tokens not yet in
the cache ("pending", the whole uncached prompt on the first step, then the
last picked token) are fed together with a draft tree of candidate tokens in
one forward pass with a tree attention mask; the target then picks its own
token at the root and walks down the tree while a child holds the token it
picked (``sampling.py`` explains why this is lossless at any temperature).
The accepted path plus the final pick are emitted, the cache is cut to the
committed tokens, and the next step begins. Modes differ only in who proposes
the tree: nobody (target-only), the request (``draft_tokens_external``: one
verification step, returning the accepted prefix plus one token; with the
draft's ``draft_logits`` it verifies by speculative sampling instead of
matching, see ``sampling.py``), the
Medusa heads (along ``medusa_choices``), the EAGLE layer (along
``eagle_choices``, one depth per EAGLE forward), or lookahead's n-gram pool
(with the Jacobi branch riding along in the same forward pass).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.catalogue import lookahead_problem
from trtspec.errors import TrtspecError
from trtspec.runtime.engine import fastpath
from trtspec.runtime.engine.config import EngineConfig, read_engine_config
from trtspec.runtime.engine.kv_reuse import (
    PrefixCache,
    cache_kwarg,
    cache_len,
    crop_cache,
    make_cache,
    select_cache,
)
from trtspec.runtime.engine.lookahead import LookaheadState
from trtspec.runtime.engine.proposers import proposer_for
from trtspec.runtime.engine.sampling import Sampler, SamplingParams


class RequestError(TrtspecError):
    """A request the engine rejects (Triton returns it as an error response)."""


@dataclass
class GenerationRequest:
    input_ids: list[int]
    max_new_tokens: int
    end_id: int | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    draft_ids: list[int] | None = None
    lookahead: tuple[int, int, int] | None = None
    min_tokens: int = 0
    # [len(draft_ids), vocab] float logits the draft sampled draft_ids from
    # (TRT-LLM's draft_logits); None = accept by matching.
    draft_logits: Any = None
    return_generation_logits: bool = False


@dataclass
class Generation:
    """One request in flight: iterate for token deltas; counters are exact when done."""

    request: GenerationRequest
    output_ids: list[int] = field(default_factory=list)
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    steps: int = 0
    reused_tokens: int = 0
    encoded_tokens: int = 0
    arrival_time_ns: int = field(default_factory=time.time_ns)
    first_scheduled_time_ns: int = 0
    first_token_time_ns: int = 0
    last_token_time_ns: int = 0
    finished: bool = False
    cancelled: bool = False
    # One [vocab] float32 row per output token (the logits it was picked
    # from), kept only when the request asks for them.
    generation_logits: list[Any] = field(default_factory=list)
    _steps: Iterator[list[int]] | None = None

    def __iter__(self) -> Iterator[list[int]]:
        assert self._steps is not None
        return self._steps

    @property
    def acceptance_rate(self) -> float:
        if self.total_draft_tokens == 0:
            return 0.0
        return self.total_accepted_draft_tokens / self.total_draft_tokens


@dataclass
class ForwardCall:
    """One step's target forward, as a sequence asks for it: ``tokens`` (pending,
    then tree nodes) after ``past`` cached positions, the tree's ``depths`` and
    ``attend`` lists (``None``: causal), the cache to grow, and the rows whose
    logits the step reads."""

    tokens: list[int]
    past: int
    n_pending: int
    depths: list[int]
    attend: list[list[int]] | None
    cache: Any
    logit_rows: list[int]


def tree_inputs(
    q: int, past: int, n_pending: int, depths: list[int], attend: list[list[int]] | None
) -> dict[str, Any]:
    """The ``attention_mask`` [1, 1, q, past + q] and ``position_ids`` of a tree
    step (pending rows causal, node j sees the pending rows and ``attend[j]``);
    empty for a plain causal step."""
    import torch

    if attend is None:
        return {}
    allowed = torch.zeros(q, past + q, dtype=torch.bool)
    allowed[:, :past] = True
    allowed[:n_pending, past : past + n_pending] = torch.ones(
        n_pending, n_pending, dtype=torch.bool
    ).tril()
    allowed[n_pending:, past : past + n_pending] = True
    for j, seen in enumerate(attend):
        for s in seen:
            allowed[n_pending + j, past + n_pending + s] = True
    mask = torch.zeros(q, past + q, dtype=torch.float32)
    mask.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    pos = list(range(past, past + n_pending)) + [past + n_pending - 1 + d for d in depths]
    return {
        "attention_mask": mask[None, None],
        "position_ids": torch.tensor([pos], dtype=torch.long),
    }


def default_threads(instances: int = 1) -> int:
    env = os.environ.get("TRTSPEC_ENGINE_THREADS")
    if env and env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (os.cpu_count() or 1) // max(1, instances))


def _medusa_tree(choices: list[list[int]]) -> list[tuple[list[int], int]]:
    """Medusa choices → [(path, parent index)], parents before children."""
    ordered = sorted({tuple(c) for c in choices}, key=lambda c: (len(c), c))
    index = {c: i for i, c in enumerate(ordered)}
    tree = []
    for c in ordered:
        parent = -1 if len(c) == 1 else index.get(c[:-1])
        if parent is None:
            raise RequestError(f"medusa choice {list(c)} has no parent {list(c[:-1])} in the tree")
        tree.append((list(c), parent))
    return tree


def _vocab_rows(rows: Any, vocab: int) -> Any:
    """``rows`` as float32 logits exactly ``vocab`` wide: a GPU engine pads its
    vocabulary (padding columns dropped); a narrower draft vocabulary gets
    -inf columns (tokens the draft cannot propose)."""
    import torch

    x = torch.as_tensor(rows, dtype=torch.float32)
    if x.shape[-1] >= vocab:
        return x[:, :vocab]
    pad = torch.full((x.shape[0], vocab - x.shape[-1]), float("-inf"))
    return torch.cat([x, pad], dim=-1)


class ReferenceEngine:
    """A loaded reference engine folder (target model, optional heads)."""

    def __init__(
        self,
        config: EngineConfig,
        model: Any,
        *,
        lookahead: tuple[int, int, int] | None,
        medusa_choices: list[list[int]] | None,
        eagle_choices: list[list[int]] | None = None,
        medusa: Any = None,
        eagle: Any = None,
        kv_reuse: int = 4,
    ) -> None:
        self.config = config
        self.model = model
        self.lookahead = lookahead
        self.medusa = medusa
        self.medusa_tree = _medusa_tree(medusa_choices) if medusa_choices else []
        self.eagle = eagle
        self.eagle_tree = _medusa_tree(eagle_choices) if eagle_choices else []
        # the smallest KV pool that serves the engine's own limits bounds what
        # it keeps for reuse (kv_reuse.PrefixCache)
        self.prefix_cache = PrefixCache(
            kv_reuse, max_tokens=config.max_batch_size * config.max_seq_len
        )
        self._fastpath = fastpath.is_fused(model)
        # the Hugging Face forward (a model the fast path does not run) needs
        # transformers' DynamicCache; the fast path takes the lean KVCache
        self._hf_cache = not self._fastpath
        self._cache_kw = "" if self._fastpath else cache_kwarg(model.model)

    # ----------------------------------------------------------------- loading
    @classmethod
    def load(
        cls,
        engine_dir: str | Path,
        *,
        threads: int | None = None,
        lookahead: tuple[int, int, int] | None = None,
        medusa_choices: list[list[int]] | None = None,
        eagle_choices: list[list[int]] | None = None,
        kv_reuse: int = 4,
    ) -> ReferenceEngine:
        import torch

        from trtspec.runtime.engine.loader import load_heads, load_target

        # The thread count is set before loading: oneDNN picks the packed
        # weights' blocked layout for it, and a different count at decode time
        # makes it reorder every weight on every call (~10x slower steps).
        torch.set_num_threads(threads or default_threads())
        config = read_engine_config(engine_dir)
        model = load_target(config)
        medusa, eagle = load_heads(config, model)
        la = lookahead or config.lookahead
        if config.mode == "lookahead" and la is None:
            raise RequestError(f"{config.path}: lookahead engine without (W, N, G) in config.json")
        mchoices = medusa_choices or config.medusa_choices
        if config.mode == "medusa" and not mchoices:
            mchoices = [[0] * d for d in range(1, config.num_medusa_heads + 1)]
        echoices = eagle_choices or config.eagle_choices
        if config.mode == "eagle" and not echoices:
            echoices = [[0] * d for d in range(1, max(config.num_eagle_layers, 1) + 1)]
        return cls(
            config,
            model,
            lookahead=la if config.mode == "lookahead" else None,
            medusa_choices=mchoices if config.mode == "medusa" else None,
            eagle_choices=echoices if config.mode == "eagle" else None,
            medusa=medusa,
            eagle=eagle,
            kv_reuse=kv_reuse,
        )

    # -------------------------------------------------------------- validation
    def validate(self, req: GenerationRequest) -> None:
        """Raise ``RequestError`` (TRT-LLM's wording where it has one) for bad requests."""
        cfg = self.config
        n = len(req.input_ids)
        if n == 0:
            raise RequestError("input_ids is empty: a request needs at least one prompt token")
        bad = [t for t in req.input_ids if not 0 <= t < cfg.vocab_size]
        if bad:
            raise RequestError(
                f"input_ids contains token id {bad[0]} outside the vocabulary [0, {cfg.vocab_size})"
            )
        if n > cfg.max_input_len:
            raise RequestError(
                f"Prompt length ({n}) exceeds maximum input length ({cfg.max_input_len})."
            )
        if req.max_new_tokens < 1:
            raise RequestError(f"request_output_len must be at least 1 (got {req.max_new_tokens})")
        if n + req.max_new_tokens > cfg.max_seq_len:
            raise RequestError(
                f"Prompt length + number of requested output tokens ({n} + {req.max_new_tokens}) "
                f"exceeds maximum sequence length ({cfg.max_seq_len})."
            )
        if req.draft_ids:
            if len(req.draft_ids) > cfg.max_draft_len:
                raise RequestError(
                    f"Number of draft tokens ({len(req.draft_ids)}) is larger than maximum number "
                    f"of draft tokens ({cfg.max_draft_len})"
                )
            if cfg.mode != "draft_tokens_external":
                raise RequestError(
                    f"draft_input_ids given, but this engine's speculative decoding mode is "
                    f"{cfg.mode}; only draft_tokens_external engines verify external drafts"
                )
            bad = [t for t in req.draft_ids if not 0 <= t < cfg.vocab_size]
            if bad:
                raise RequestError(
                    f"draft_input_ids contains token id {bad[0]} outside the "
                    f"vocabulary [0, {cfg.vocab_size})"
                )
        if req.draft_logits is not None:
            shape = tuple(req.draft_logits.shape)
            want = (len(req.draft_ids or []), cfg.vocab_size)
            if not req.draft_ids:
                raise RequestError(
                    "draft_logits given without draft_input_ids: the logits "
                    "belong to the drafted tokens"
                )
            if len(shape) != 2 or shape[0] != want[0] or shape[1] < 1:
                raise RequestError(
                    f"draft_logits has shape {list(shape)}; expected [{want[0]}, {want[1]}] "
                    "(one row of vocabulary logits per draft token)"
                )
        if req.lookahead is not None:
            if self.lookahead is None:
                raise RequestError(
                    "lookahead_window_size/ngram_size/verification_set_size given, but the engine "
                    "was not built for lookahead decoding"
                )
            w, ng, g = req.lookahead
            W, N, G = self.lookahead
            if w > W or ng > N or g > G or w < 1 or ng < 1 or g < 0:
                raise RequestError(
                    f"Lookahead config (w={w}, n={ng}, g={g}) is not within the engine's "
                    f"(W={W}, N={N}, G={G}): need 1 <= w <= W, 1 <= n <= N, 0 <= g <= G"
                )
            if lookahead_problem(w, ng, g) is not None:  # the range check leaves only n == 1
                raise RequestError(
                    f"Lookahead config (w={w}, n={ng}, g={g}) is invalid: n == 1 requires "
                    "w == 1 and g == 0"
                )

    # -------------------------------------------------------------- public API
    def stream(
        self, req: GenerationRequest, cancelled: Callable[[], bool] | None = None
    ) -> Generation:
        """Validate and start a request; iterate the result for per-step token deltas.

        ``cancelled`` is asked before every step; once it says yes the
        generation ends there (``gen.cancelled``), its KV cache is dropped
        rather than kept for prefix reuse, and iteration stops."""
        self.validate(req)
        gen = Generation(request=req)
        gen._steps = self._run(gen, cancelled)
        return gen

    def generate(self, req: GenerationRequest) -> Generation:
        gen = self.stream(req)
        for _ in gen:
            pass
        return gen

    def hidden_states(self, ids: list[int]) -> Any:
        """The target's final hidden states [len(ids), hidden] for ``ids`` from an empty cache."""
        import torch

        with torch.inference_mode():
            _, hidden = self._forward(
                list(ids),
                0,
                len(ids),
                depths=[],
                attend=None,
                cache=make_cache(hf=self._hf_cache),
                logit_rows=[len(ids) - 1],
            )
        return hidden

    # --------------------------------------------------------------- internals
    def _forward(
        self,
        tokens: list[int],
        past: int,
        n_pending: int,
        *,
        depths: list[int],
        attend: list[list[int]] | None,
        cache: Any,
        logit_rows: list[int],
    ) -> tuple[Any, Any]:
        """Run pending + node tokens; (logits of ``logit_rows`` only, all hidden rows).

        The vocabulary projection is a large share of a small model's step, so
        rows nobody reads (the prompt, the lookahead branch's inner rows) skip it."""
        import torch

        ids = torch.tensor([tokens], dtype=torch.long)
        kwargs = tree_inputs(len(tokens), past, n_pending, depths, attend)
        if self._fastpath:
            hidden = fastpath.forward(self.model, ids, cache, **kwargs)
        else:
            kwargs[self._cache_kw] = cache
            hidden = self.model.model(input_ids=ids, use_cache=True, **kwargs).last_hidden_state[0]
        first = logit_rows[0]
        if logit_rows == list(range(first, first + len(logit_rows))):
            rows = hidden[first : first + len(logit_rows)]
        else:
            rows = hidden[torch.tensor(logit_rows)]
        logits = self.model.lm_head(rows).float()
        return logits, hidden

    def _run(self, gen: Generation, cancelled: Callable[[], bool] | None) -> Iterator[list[int]]:
        """Drive ``_loop`` alone: each ``ForwardCall`` it yields runs at once."""
        import torch

        with torch.inference_mode():
            steps = self._loop(gen, cancelled)
            result: Any = None
            while True:
                try:
                    item = steps.send(result)
                except StopIteration:
                    return
                if isinstance(item, ForwardCall):
                    result = self._forward(
                        item.tokens,
                        item.past,
                        item.n_pending,
                        depths=item.depths,
                        attend=item.attend,
                        cache=item.cache,
                        logit_rows=item.logit_rows,
                    )
                else:
                    result = None
                    yield item

    def _loop(
        self,
        gen: Generation,
        cancelled: Callable[[], bool] | None = None,
    ) -> Generator[ForwardCall | list[int], Any, None]:
        """One request's steps as a coroutine: it yields a ``ForwardCall`` and is
        sent back ``(logits, hidden)``, and yields each step's emitted tokens
        (sent ``None``). ``_run`` answers the calls one by one; the in-flight
        batcher (``batching.py``) answers many sequences' calls in one pass and
        handles cancellation itself, between steps."""
        import torch

        req = gen.request
        sampler = Sampler(req.sampling)
        prompt = list(req.input_ids)
        gen.first_scheduled_time_ns = time.time_ns()
        n_reuse, entry = self.prefix_cache.lookup(prompt)
        proposer = proposer_for(self, req, prompt)
        need_features = proposer.needs_features
        if entry is not None and n_reuse > 0 and (not need_features or entry.features is not None):
            cache = make_cache(
                [(k[..., :n_reuse, :], v[..., :n_reuse, :]) for k, v in entry.kv],
                hf=self._hf_cache,
            )
            feats = entry.features[:n_reuse] if need_features else None
        else:
            n_reuse, cache, feats = 0, make_cache(hf=self._hf_cache), None
        gen.reused_tokens = n_reuse
        committed: list[int] = prompt[:n_reuse]
        pending: list[int] = prompt[n_reuse:]
        out = gen.output_ids
        end_id = req.end_id
        root_hidden = None  # hidden state of the row that picked pending[-1] (Medusa)
        draft_logits = None
        if req.draft_logits is not None and req.draft_ids:
            draft_logits = _vocab_rows(req.draft_logits, self.config.vocab_size)

        while len(out) < req.max_new_tokens:
            if cancelled is not None and cancelled():
                gen.cancelled = True  # the cache (a local) goes with this frame
                return
            budget = req.max_new_tokens - len(out) - 1  # drafts beyond this cannot be emitted
            root = pending[-1]
            # ---- propose: node tokens, parent (-1 = root), depth
            if req.draft_ids:  # drafted outside (draft_tokens_external): one chain
                nodes = list(req.draft_ids[:budget])
                parents = list(range(-1, len(nodes) - 1))
            else:
                nodes, parents = proposer.propose(committed, root, feats, root_hidden, budget)
            depths: list[int] = []
            for p in parents:
                depths.append(1 if p < 0 else depths[p] + 1)
            n_verify = len(nodes)
            tokens = pending + nodes
            attend: list[list[int]] | None = None
            chain_only = all(p == i - 1 for i, p in enumerate(parents))
            branch_rows = 0
            extra = proposer.branch()
            if extra is not None:
                b_tokens, b_depths, b_attend, b_logit_rows = extra
                branch_rows = len(b_tokens)
                tokens += b_tokens
                depths += b_depths
                chain_only = False
            if not chain_only:
                attend = []
                for i in range(n_verify):
                    path, j = [], i
                    while j >= 0:
                        path.append(j)
                        j = parents[j]
                    attend.append(path)
                if branch_rows:
                    attend += [[n_verify + s for s in seen] for seen in b_attend]
            past = cache_len(cache)
            p = len(pending)
            # root + verification nodes, then the rows the branch asks logits for
            logit_rows = list(range(p - 1, p + n_verify))
            if branch_rows:
                logit_rows += [p + n_verify + r for r in b_logit_rows]
            logits, hidden = yield ForwardCall(tokens, past, p, depths, attend, cache, logit_rows)
            gen.encoded_tokens += len(tokens)
            gen.steps += 1

            def target_row(row: int, produced: int, logits: Any = logits) -> Any:
                row_logits = logits[row]
                if len(out) + produced < req.min_tokens and end_id is not None:
                    row_logits = row_logits.clone()
                    row_logits[end_id] = float("-inf")
                return row_logits

            if draft_logits is not None:
                path_nodes, bonus = _verify_by_logits(sampler, target_row, nodes, draft_logits)
            else:
                path_nodes, bonus = _verify_tree(sampler, target_row, nodes, parents)
            gen.total_draft_tokens += n_verify
            gen.total_accepted_draft_tokens += len(path_nodes)
            if branch_rows:
                proposer.advance(logits[1 + n_verify :])
            # ---- commit: keep pending rows + the accepted path in the cache
            keep_rows = list(range(p)) + [p + i for i in path_nodes]
            if len(keep_rows) != len(tokens):
                if keep_rows == list(range(len(keep_rows))):
                    cache = crop_cache(cache, past + len(keep_rows))
                else:
                    idx = torch.tensor(list(range(past)) + [past + r for r in keep_rows])
                    cache = select_cache(cache, idx)
            accepted = [nodes[i] for i in path_nodes]
            committed += pending + accepted
            last_row_idx = keep_rows[-1]
            root_hidden = hidden[last_row_idx]
            if need_features:
                new_feats = hidden[torch.tensor(keep_rows)]
                feats = new_feats if feats is None else torch.cat([feats, new_feats])
            proposer.observe(committed, bonus)
            pending = [bonus]
            emitted = [*accepted, bonus][: req.max_new_tokens - len(out)]
            stop = False
            if end_id is not None and end_id in emitted:
                emitted = emitted[: emitted.index(end_id)]
                stop = True
            now = time.time_ns()
            if req.return_generation_logits:
                # The row that picked each emitted token: root, then each kept node's.
                rows = [0, *(1 + i for i in path_nodes)][: len(emitted)]
                gen.generation_logits.extend(logits[r] for r in rows)
            out.extend(emitted)
            # A draft_tokens_external request is one verification step (the BLS
            # loop reads "accepted prefix + 1 token" from it).
            done = stop or len(out) >= req.max_new_tokens or bool(req.draft_ids)
            if done:
                self._finish(gen, committed, cache, feats)
            if emitted:
                if not gen.first_token_time_ns:
                    gen.first_token_time_ns = now
                gen.last_token_time_ns = now
                yield emitted
            if done:
                return
        self._finish(gen, committed, cache, feats)

    def _finish(self, gen: Generation, committed: list[int], cache: Any, feats: Any) -> None:
        """Mark ``gen`` finished (before its last delta is yielded) and keep its cache."""
        if not gen.last_token_time_ns:
            gen.first_token_time_ns = gen.last_token_time_ns = time.time_ns()
        self.prefix_cache.store(committed, cache, feats)
        gen.finished = True

    def _propose_medusa(self, root_hidden: Any, budget: int) -> tuple[list[int], list[int]]:
        import torch

        head_logits = self.medusa(root_hidden)  # [K, vocab]
        k = max(max(c) for c, _ in self.medusa_tree) + 1
        top = torch.topk(head_logits, k, dim=-1).indices.tolist()
        nodes: list[int] = []
        parents: list[int] = []
        kept: dict[int, int] = {}
        for i, (choice, parent) in enumerate(self.medusa_tree):
            depth = len(choice)
            if depth > budget or depth > len(top):
                continue
            if parent >= 0 and parent not in kept:
                continue
            kept[i] = len(nodes)
            nodes.append(top[depth - 1][choice[-1]])
            parents.append(-1 if parent < 0 else kept[parent])
        return nodes, parents

    def _propose_eagle(
        self, committed: list[int], root: int, feats: Any, cache: Any, *, fed: int, budget: int
    ) -> tuple[list[int], list[int], Any, int]:
        """EAGLE-1 draft tree along ``eagle_choices``, expanded one depth per forward.

        The pairs (token_{i+1}, feature_i) of newly committed positions extend
        the EAGLE layer's own cache first; then each depth's nodes run together
        (each attending to the committed pairs and its ancestors), and a node's
        k-th best next token becomes the child at choice index k. Draft pairs
        are cropped away afterwards; committed ones stay."""
        import torch

        m = len(committed)
        nxt = [*committed[fed + 1 : m], root]
        tokens = torch.tensor([nxt], dtype=torch.long)
        pos = torch.arange(fed, m, dtype=torch.long)[None]
        h, logits = self.eagle.forward(tokens, feats[fed:m][None], pos, cache)
        top_k = max(c[-1] for c, _ in self.eagle_tree) + 1
        # per tree node: (top-k next tokens, hidden) once the node has been run
        node_top: dict[int, list[int]] = {-1: torch.topk(logits[0, -1], top_k).indices.tolist()}
        node_h: dict[int, Any] = {}
        slot: dict[int, int] = {}
        kept: dict[int, int] = {}
        nodes: list[int] = []
        parents: list[int] = []
        has_child = {p for _, p in self.eagle_tree}
        max_depth = min(budget, max(len(c) for c, _ in self.eagle_tree))
        for depth in range(1, max_depth + 1):
            level = [
                i
                for i, (c, p) in enumerate(self.eagle_tree)
                if len(c) == depth and (p < 0 or p in kept)
            ]
            for i in level:
                choice, parent = self.eagle_tree[i]
                kept[i] = len(nodes)
                nodes.append(node_top[parent][choice[-1]])
                parents.append(-1 if parent < 0 else kept[parent])
            run = [i for i in level if i in has_child] if depth < max_depth else []
            if not run:
                continue
            past = cache_len(cache)
            q = len(run)
            allowed = torch.zeros(q, past + q, dtype=torch.bool)
            allowed[:, :m] = True
            for r, i in enumerate(run):
                allowed[r, past + r] = True
                parent = self.eagle_tree[i][1]
                while parent >= 0:
                    allowed[r, slot[parent]] = True
                    parent = self.eagle_tree[parent][1]
            mask = torch.zeros(q, past + q).masked_fill_(~allowed, torch.finfo(torch.float32).min)
            toks = torch.tensor([[nodes[kept[i]] for i in run]], dtype=torch.long)
            parent_h = torch.stack(
                [
                    node_h[self.eagle_tree[i][1]] if self.eagle_tree[i][1] >= 0 else h[0, -1]
                    for i in run
                ]
            )
            positions = torch.full((1, q), m - 1 + depth, dtype=torch.long)
            hs, lg = self.eagle.forward(
                toks, parent_h[None], positions, cache, mask=mask[None, None]
            )
            top = torch.topk(lg[0], top_k, dim=-1).indices.tolist()
            for r, i in enumerate(run):
                slot[i] = past + r
                node_h[i] = hs[0, r]
                node_top[i] = top[r]
        return nodes, parents, crop_cache(cache, m), m

    @staticmethod
    def _lookahead_candidates(
        state: LookaheadState, root: int, budget: int
    ) -> tuple[list[int], list[int]]:
        """The verification branch as a trie of pool n-grams for ``root``."""
        nodes: list[int] = []
        parents: list[int] = []
        index: dict[tuple[int, int], int] = {}
        for gram in state.candidates(root):
            parent = -1
            for tok in gram[:budget]:
                key = (parent, tok)
                if key not in index:
                    index[key] = len(nodes)
                    nodes.append(tok)
                    parents.append(parent)
                parent = index[key]
        return nodes, parents


def _verify_by_logits(
    sampler: Sampler, target_row: Callable[[int, int], Any], nodes: list[int], draft_logits: Any
) -> tuple[list[int], int]:
    """Speculative sampling along a draft chain: the accepted node indices and
    the bonus token (the replacement at the first rejection, else a fresh pick)."""
    path_nodes: list[int] = []
    replacement = None
    for i in range(len(nodes)):
        replacement = sampler.accept_by_logits(target_row(i, i), draft_logits[i], nodes[i])
        if replacement is not None:
            break
        path_nodes.append(i)
    if replacement is not None:
        return path_nodes, replacement
    return path_nodes, sampler.pick_independent(target_row(len(path_nodes), len(path_nodes)))


def _verify_tree(
    sampler: Sampler, target_row: Callable[[int, int], Any], nodes: list[int], parents: list[int]
) -> tuple[list[int], int]:
    """Walk the draft tree from the root while the target's pick has a child:
    the accepted node indices and the bonus token (the pick that had none)."""
    children: dict[int, dict[int, int]] = {}
    for i in range(len(nodes)):
        children.setdefault(parents[i], {}).setdefault(nodes[i], i)
    path_nodes: list[int] = []
    cur = -1
    while True:
        pick = sampler.pick(target_row(0 if cur < 0 else 1 + cur, len(path_nodes)))
        nxt = children.get(cur, {}).get(pick)
        if nxt is None:
            return path_nodes, pick
        path_nodes.append(nxt)
        cur = nxt


def load_engine(engine_dir: str | Path, **kwargs: Any) -> ReferenceEngine:
    return ReferenceEngine.load(engine_dir, **kwargs)
