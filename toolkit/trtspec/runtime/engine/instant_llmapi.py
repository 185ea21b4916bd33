"""The instant engine behind the LLM-API flow's ``llmapi`` tensors, for
measuring what trtspec's path around an LLM-API model costs
(``benchmarks/ceiling.py --flow llmapi``).

It is ``trtspec.runtime.engine.llmapi_model`` — the CPU stand-in for Triton's
``llmapi`` model, with its inputs, outputs, request threads, text deltas and
``stream_interval`` — with the reference engine swapped for a step loop that
computes nothing: every ``instant_step_ms`` milliseconds (config parameter, as
the engine flow's ``trtspec.runtime.engine.instant_model`` reads it; 0 = as fast as it
can) every request in flight gets its next token, ``instant_model.next_token``
over the tokenizer's vocabulary (never the end id, so every request runs to
its ``max_tokens``). Baseline only: a ``speculative_config`` is refused. Only
``trtspec.bench.instant.use_instant_llm`` writes it into a repository, and
only for benchmarking; the product's assembly never does. numpy and the
tokenizer only: no torch, no weights.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trtspec.runtime.engine import llmapi_model as stand_in
from trtspec.runtime.engine.instant_model import STEP_PARAMETER, next_token
from trtspec.runtime.engine.triton_model import _param

_END = None  # the stream's end marker


class _Stream:
    """One request's tokens as the step loop makes them: iterating yields a
    list of new token ids per step until the request has all of them."""

    def __init__(self, ids: list[int], max_new: int, cancelled: Callable[[], bool] | None) -> None:
        self.last = ids[-1] if ids else 0
        self.length = len(ids)
        self.left = max_new
        self.cancelled = cancelled
        self.items: queue.SimpleQueue[list[int] | None] = queue.SimpleQueue()

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            item = self.items.get()
            if item is _END:
                return
            yield item


class InstantScheduler:
    """What ``llmapi_model``'s baseline path calls (``submit(request,
    is_cancelled=...)`` → an iterable of token deltas): one thread steps
    every ``step_s`` seconds and gives each request in flight one token."""

    def __init__(self, step_s: float, vocab: int, avoid: tuple[int, ...]) -> None:
        self.step_s = step_s
        self.vocab = vocab
        self.avoid = avoid
        self.steps = 0
        self._pending: list[_Stream] = []
        self._active: list[_Stream] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="instant-llm", daemon=True)
        self._thread.start()

    def submit(self, request: Any, is_cancelled: Callable[[], bool] | None = None) -> _Stream:
        stream = _Stream(list(request.input_ids), int(request.max_new_tokens), is_cancelled)
        if stream.left <= 0:
            stream.items.put(_END)
            return stream
        with self._cond:
            self._pending.append(stream)
            self._cond.notify()
        return stream

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._pending and not self._active:
                    self._cond.wait()
                if self._closed:
                    for stream in [*self._active, *self._pending]:
                        stream.items.put(_END)
                    return
                self._active.extend(self._pending)
                self._pending.clear()
            started = time.monotonic()
            self.steps += 1
            still = []
            for stream in self._active:
                if stream.cancelled is not None and stream.cancelled():
                    stream.items.put(_END)
                    continue
                token = next_token(stream.last, stream.length, self.vocab, self.avoid)
                stream.last, stream.length, stream.left = token, stream.length + 1, stream.left - 1
                stream.items.put([token])
                if stream.left > 0:
                    still.append(stream)
                else:
                    stream.items.put(_END)
            self._active = still
            wait = self.step_s - (time.monotonic() - started)
            if wait > 0 and still:
                time.sleep(wait)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)


class TritonPythonModel(stand_in.TritonPythonModel):
    """The ``llmapi`` stand-in over the instant step loop (see the module docstring)."""

    def initialize(self, args: dict[str, Any]) -> None:
        llm, path, model_dir = self._configure(args)
        if self.speculation is not None:
            raise stand_in.LlmApiConfigError(
                f"{path}: the instant LLM serves the baseline only (no speculative_config)"
            )
        self._load_tokenizer(llm, model_dir)
        data = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
        vocab = int(data.get("vocab_size") or 32000)
        avoid = tuple(t for t in (self.end_id, self.tokenizer.pad_id) if t is not None)
        step_s = float(_param(self.config, STEP_PARAMETER) or 0.0) / 1000.0
        self.scheduler = InstantScheduler(step_s, vocab, avoid)  # type: ignore[assignment]
