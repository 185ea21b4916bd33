"""In-flight batching for the reference engine: many sequences, one forward per step.

TensorRT-LLM's batch manager runs every active request's tokens of a step
together: prefill chunks, single decode tokens and each sequence's draft or
verification tree, packed without padding (``remove_input_padding``) with
attention per sequence. ``BatchScheduler`` does the same for a
``ReferenceEngine``. Each request's decode loop (``ReferenceEngine._loop``) is a
coroutine that yields the ``ForwardCall`` its next step needs; one scheduler
thread collects the pending calls of all active sequences, runs them through
``fastpath.forward_packed`` in one pass (every projection and the MLP see one
matrix of all rows, so weights are read once per step) and sends each
sequence its own logits and hidden rows back. Proposing (Medusa heads, the
EAGLE layer, lookahead's pool) and verifying stay per sequence, inside its
coroutine, so every mode and its losslessness are exactly the solo engine's.

Requests join and leave between steps. At most ``max_batch_size`` sequences
are active; the rest wait FIFO (TRT-LLM's ``guaranteed_no_evict``). A step
holds at most ``max_num_tokens`` rows: sequences are taken oldest first while
their call fits; a call that cannot fit even in an empty step (a prompt longer
than the budget) is prefilled in chunks of its leading prompt tokens, which
need no logits (TRT-LLM's chunked context). A call that could fit waits for
the next step and goes first then.

Outputs do not depend on batch neighbours: attention is per sequence, and
oneDNN-packed float32 projections compute each row independently (the tests
check bit equality with the solo engine); projections that are not row
independent (dynamic int8, plain sgemm) run per sequence inside the packed
step. Sampling uses each request's own seeded generator. A chunked prefill
attends over the cache in pieces, which is the one place results may differ
from the unchunked solo run in the last bits (as with TRT-LLM's chunked
context); the tests check that the tiny model's outputs still agree.

Memory: every step allocates each sequence's grown KV and frees the old one,
so a busy scheduler leaves glibc's heap full of freed pages it keeps. Once
nothing has been in flight for ``IDLE_TRIM_S``, and at most every
``TRIM_EVERY_S``, the scheduler hands them back
(``loader.release_free_memory``, ``malloc_trim``): an engine whose arm of a
benchmark is done no longer holds its busiest moment's heap while the other
arms run (issue 24: ~80–120 MiB per engine of the demo). Both bounds keep
the trim out of a draft loop's rounds, which leave each engine idle while
the other steps (on a loaded machine up to a second at 8 in flight), since
the next step faults the returned pages back in; it changes no token.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trtspec.runtime.engine import fastpath
from trtspec.runtime.engine.config import default_max_num_tokens
from trtspec.runtime.engine.decode import (
    ForwardCall,
    Generation,
    GenerationRequest,
    ReferenceEngine,
    tree_inputs,
)

#: ``listener(gen, delta, error)``: a step's new tokens (``delta``), or the end
#: of the request (``delta is None``; ``error`` set when it failed).
Listener = Callable[[Generation, "list[int] | None", "BaseException | None"], None]


POLL_NS = 50_000_000
#: seconds with nothing in flight before the scheduler trims the heap
IDLE_TRIM_S = 2.0
#: seconds at least between two trims
TRIM_EVERY_S = 10.0


class BatchedGeneration(Generation):
    """A ``Generation`` served by a ``BatchScheduler``: iterate it for deltas
    (from any thread); ``cancel()`` drops it at the next step boundary."""

    def __init__(self, request: GenerationRequest, scheduler: BatchScheduler) -> None:
        super().__init__(request=request)
        self.cancelled = False
        self.error: BaseException | None = None
        self._scheduler = scheduler
        self._events: deque[list[int] | None] = deque()
        self._ready = threading.Condition()

    def cancel(self) -> None:
        self._scheduler.cancel(self)

    def _push(self, delta: list[int] | None) -> None:
        with self._ready:
            self._events.append(delta)
            self._ready.notify()

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            with self._ready:
                while not self._events:
                    self._ready.wait()
                delta = self._events.popleft()
            if delta is None:
                if self.error is not None:
                    raise self.error
                return
            yield delta


@dataclass
class _Sequence:
    gen: BatchedGeneration
    steps: Any  # the request's ``_loop`` coroutine
    listener: Listener | None
    is_cancelled: Callable[[], bool] | None
    call: ForwardCall | None = None
    chunks: list[Any] = field(default_factory=list)  # hidden rows of prefilled chunks
    chunked: int = 0  # prompt tokens already prefilled by chunks
    deferred: int = 0  # steps this sequence's call waited for room
    polled_ns: int = 0  # when ``is_cancelled`` was last asked


@dataclass
class StepStats:
    """What the scheduler did, for tests and benchmarks."""

    steps: int = 0
    tokens: int = 0
    max_step_tokens: int = 0
    max_step_sequences: int = 0
    chunked_steps: int = 0
    mixed_steps: int = 0  # steps holding a prefill and a decode/verify call together
    finished: int = 0
    cancelled: int = 0
    trims: int = 0  # heap trims while idle (IDLE_TRIM_S)


def _engine_max_num_tokens(engine: ReferenceEngine) -> int:
    cfg = engine.config
    value = (cfg.raw.get("build_config") or {}).get("max_num_tokens")
    if value:
        return int(value)
    return default_max_num_tokens(cfg.max_batch_size, cfg.max_draft_len, cfg.max_input_len)


class BatchScheduler:
    """One thread running every in-flight request of ``engine`` step by step."""

    def __init__(
        self,
        engine: ReferenceEngine,
        *,
        max_batch_size: int | None = None,
        max_num_tokens: int | None = None,
    ) -> None:
        self.engine = engine
        self.max_batch_size = max(1, max_batch_size or engine.config.max_batch_size)
        self.max_num_tokens = max(1, max_num_tokens or _engine_max_num_tokens(engine))
        self.stats = StepStats()
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._cancel: set[int] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._ended_since_trim = False  # a sequence ended: its KV went back to the heap
        self._idle_since: float | None = None
        self._trimmed_at = float("-inf")

    # -------------------------------------------------------------- public API
    def submit(
        self,
        req: GenerationRequest,
        *,
        listener: Listener | None = None,
        is_cancelled: Callable[[], bool] | None = None,
    ) -> BatchedGeneration:
        """Validate ``req`` (``RequestError`` at once) and queue it; events go to
        ``listener`` in the scheduler thread, or to the returned generation's
        iterator. ``is_cancelled`` is polled between steps."""
        self.engine.validate(req)
        gen = BatchedGeneration(req, self)
        seq = _Sequence(gen, self.engine._loop(gen), listener, is_cancelled)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch scheduler is closed")
            self._waiting.append(seq)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="trtspec-batcher", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return gen

    def generate(self, req: GenerationRequest) -> BatchedGeneration:
        gen = self.submit(req)
        for _ in gen:
            pass
        return gen

    def cancel(self, gen: Generation) -> None:
        with self._cond:
            self._cancel.add(id(gen))
            self._cond.notify()

    @property
    def active(self) -> int:
        with self._cond:
            return len(self._active)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._waiting)

    def close(self) -> None:
        """Stop the thread after failing every queued and active request."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # ----------------------------------------------------------------- thread
    def _serve(self) -> None:
        import torch

        with torch.inference_mode():
            while True:
                admitted = self._admit()
                if admitted is None:
                    return
                for seq in admitted:
                    self._advance(seq, None)
                if self._active:
                    self._step()
                elif not admitted:  # idle for IDLE_TRIM_S since the last one ended
                    from trtspec.runtime.engine.loader import release_free_memory

                    release_free_memory()
                    self._trimmed_at = time.monotonic()
                    self.stats.trims += 1

    def _admit(self) -> list[_Sequence] | None:
        """Drop cancelled sequences, move waiting ones in; ``None`` when closed,
        ``[]`` with nothing active when the heap is due a trim (idle for
        ``IDLE_TRIM_S``, the last trim ``TRIM_EVERY_S`` ago)."""
        with self._cond:
            while True:
                if self._closed:
                    for seq in [*self._active, *self._waiting]:
                        self._end(seq, RuntimeError("the batch scheduler was closed"))
                    self._active.clear()
                    self._waiting.clear()
                    return None
                for group in (self._active, self._waiting):
                    for seq in [s for s in group if self._is_cancelled(s)]:
                        group.remove(seq)
                        seq.steps.close()  # frees its cache
                        seq.gen.cancelled = True
                        self.stats.cancelled += 1
                        self._end(seq, None)
                self._cancel.clear()
                admitted = []
                while self._waiting and len(self._active) < self.max_batch_size:
                    seq = self._waiting.popleft()
                    self._active.append(seq)
                    admitted.append(seq)
                if admitted or self._active:
                    self._idle_since = None
                    return admitted
                if self._ended_since_trim:
                    now = time.monotonic()
                    if self._idle_since is None:
                        self._idle_since = now
                    due = max(self._idle_since + IDLE_TRIM_S, self._trimmed_at + TRIM_EVERY_S)
                    if now >= due:
                        self._ended_since_trim = False
                        self._idle_since = None
                        return []
                    self._cond.wait(due - now)
                    continue
                self._cond.wait()

    def _is_cancelled(self, seq: _Sequence) -> bool:
        if id(seq.gen) in self._cancel:
            return True
        # Triton's is_cancelled is a round trip to the server: ask every POLL_NS at most.
        now = time.monotonic_ns()
        poll = seq.is_cancelled
        if poll is None or now - seq.polled_ns < POLL_NS:
            return False
        seq.polled_ns = now
        try:
            return bool(poll())
        except Exception:  # a broken poll must not stop the batch
            return False

    def _end(self, seq: _Sequence, error: BaseException | None) -> None:
        self._ended_since_trim = True
        gen = seq.gen
        gen.error = error
        if error is None and not gen.cancelled:
            self.stats.finished += 1
        self._notify(seq, None, error)

    def _notify(self, seq: _Sequence, delta: list[int] | None, error: BaseException | None) -> None:
        if seq.listener is None:
            seq.gen._push(delta)
            return
        try:
            seq.listener(seq.gen, delta, error)
        except Exception:  # the listener's failure is its request's, not the batch's
            import traceback

            traceback.print_exc()

    def _advance(self, seq: _Sequence, result: Any) -> None:
        """Send ``result`` to the sequence's coroutine and run it to its next
        forward call, passing emitted tokens on; retire it when it ends."""
        try:
            while True:
                item = seq.steps.send(result)
                if isinstance(item, ForwardCall):
                    seq.call = item
                    return
                result = None
                self._notify(seq, item, None)
        except StopIteration:
            error = None
        except Exception as exc:
            error = exc
        seq.call = None
        with self._cond:
            if seq in self._active:
                self._active.remove(seq)
        self._end(seq, error)

    def _plan_step(self) -> list[tuple[_Sequence, int]]:
        """(sequence, rows) for this step: oldest-deferred first, then FIFO;
        rows < len(call.tokens) means a prefill chunk."""
        with self._cond:
            ready = [s for s in self._active if s.call is not None]
        order = sorted(range(len(ready)), key=lambda i: (-ready[i].deferred, i))
        budget = self.max_num_tokens
        chosen: list[tuple[_Sequence, int]] = []
        for i in order:
            seq = ready[i]
            call = seq.call
            assert call is not None
            need = len(call.tokens)
            if need <= budget:
                chosen.append((seq, need))
                budget -= need
                seq.deferred = 0
            elif need > self.max_num_tokens and call.n_pending > 1 and budget > 0:
                # Never fits: prefill the leading prompt tokens (no logits read
                # from them); the last pending token stays for the real call.
                chosen.append((seq, min(budget, call.n_pending - 1)))
                budget = 0
                seq.deferred = 0
            else:
                seq.deferred += 1
        if not chosen and ready:  # a single call over the budget with nothing to chunk
            chosen.append((ready[order[0]], len(ready[order[0]].call.tokens)))  # type: ignore[union-attr]
        return chosen

    def _step(self) -> None:
        chosen = self._plan_step()
        if not chosen:
            return
        calls: list[tuple[ForwardCall, int]] = []
        for seq, rows in chosen:
            assert seq.call is not None
            calls.append((seq.call, rows))
        try:
            results = packed_step(self.engine, calls)
        except Exception as exc:  # the whole step failed: fail its sequences, keep serving
            for seq, _ in chosen:
                seq.steps.close()
                with self._cond:
                    if seq in self._active:
                        self._active.remove(seq)
                self._end(seq, exc)
            return
        rows_total = sum(rows for _, rows in chosen)
        st = self.stats
        st.steps += 1
        st.tokens += rows_total
        st.max_step_tokens = max(st.max_step_tokens, rows_total)
        st.max_step_sequences = max(st.max_step_sequences, len(chosen))
        kinds = {seq.call.n_pending > 1 for seq, _ in chosen if seq.call is not None}
        st.mixed_steps += len(kinds) == 2
        for (seq, rows), (logits, hidden) in zip(chosen, results, strict=True):
            call = seq.call
            assert call is not None
            if rows < len(call.tokens):
                st.chunked_steps += 1
                seq.chunks.append(hidden)
                seq.chunked += rows
                seq.call = ForwardCall(
                    call.tokens[rows:],
                    call.past + rows,
                    call.n_pending - rows,
                    call.depths,
                    call.attend,
                    call.cache,
                    [r - rows for r in call.logit_rows],
                )
                continue
            if seq.chunks:
                import torch

                rows_hidden = torch.cat([*seq.chunks, hidden])
                seq.chunks, seq.chunked = [], 0
            else:
                rows_hidden = hidden
            seq.call = None
            self._advance(seq, (logits, rows_hidden))


def packed_step(
    engine: ReferenceEngine,
    calls: list[tuple[ForwardCall, int]],
) -> list[tuple[Any, Any]]:
    """Run the first ``rows`` tokens of each call in one packed forward;
    ``(logits of the call's logit_rows or None for a chunk, hidden rows)`` each."""
    import torch

    if len(calls) == 1 and calls[0][1] == len(calls[0][0].tokens):
        c = calls[0][0]  # alone: exactly the solo engine's forward
        return [
            engine._forward(
                c.tokens,
                c.past,
                c.n_pending,
                depths=c.depths,
                attend=c.attend,
                cache=c.cache,
                logit_rows=c.logit_rows,
            )
        ]
    if not engine._fastpath:  # Hugging Face forward: one sub-step per sequence
        return [_solo(engine, c, rows) for c, rows in calls]
    segments = []
    ids: list[int] = []
    for c, rows in calls:
        if rows < len(c.tokens):
            kwargs: dict[str, Any] = {}
        else:
            kwargs = tree_inputs(rows, c.past, c.n_pending, c.depths, c.attend)
        segments.append(
            fastpath.Segment(
                c.cache, rows, kwargs.get("position_ids"), kwargs.get("attention_mask")
            )
        )
        ids += c.tokens[:rows]
    hidden = fastpath.forward_packed(engine.model, torch.tensor([ids], dtype=torch.long), segments)
    picks: list[int] = []
    start = 0
    bounds = []
    for c, rows in calls:
        bounds.append((start, start + rows))
        if rows == len(c.tokens):
            picks += [start + r for r in c.logit_rows]
        start += rows
    logits = engine.model.lm_head(hidden[torch.tensor(picks)]).float() if picks else None
    out: list[tuple[Any, Any]] = []
    used = 0
    for (c, rows), (a, b) in zip(calls, bounds, strict=True):
        if rows < len(c.tokens):
            out.append((None, hidden[a:b]))
            continue
        n = len(c.logit_rows)
        assert logits is not None
        out.append((logits[used : used + n], hidden[a:b]))
        used += n
    return out


def _solo(engine: ReferenceEngine, c: ForwardCall, rows: int) -> tuple[Any, Any]:
    if rows == len(c.tokens):
        return engine._forward(
            c.tokens,
            c.past,
            c.n_pending,
            depths=c.depths,
            attend=c.attend,
            cache=c.cache,
            logit_rows=c.logit_rows,
        )
    _, hidden = engine._forward(
        c.tokens[:rows], c.past, rows, depths=[], attend=None, cache=c.cache, logit_rows=[rows - 1]
    )
    return None, hidden


def serve_all(
    scheduler: BatchScheduler,
    requests: list[GenerationRequest],
) -> list[BatchedGeneration]:
    """Submit ``requests`` together and wait for all (tests, benchmarks)."""
    gens = [scheduler.submit(r) for r in requests]
    for gen in gens:
        for _ in gen:
            pass
    return gens


def wait_idle(scheduler: BatchScheduler, timeout: float = 30.0) -> bool:
    """Whether the scheduler has no active or waiting sequence within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if scheduler.active == 0 and scheduler.waiting == 0:
            return True
        time.sleep(0.01)
    return False
