"""An instant engine: a Triton Python model with the reference engine's tensor
contract (docs/design/engine-contract.md) that computes nothing, for measuring what the
serving path around an engine costs (``benchmarks/ceiling.py``).

It never stands in for a real engine in a product repository: only
``trtspec.bench.instant.use_instant_engines`` writes it into a repository,
and only for benchmarking. It takes the same inputs as
``trtspec.runtime.engine.triton_model`` (same checks, same error words) and answers
with the same outputs, batching in flight like the real one: one scheduler
thread runs a *step* every ``instant_step_ms`` milliseconds (config parameter;
0 = as fast as it can, the ceiling; e.g. 8 to mimic a GPU's batch step) and
each step gives every in-flight request its next token, so a step's cost does
not grow with the batch. A streaming request gets one response per step,
sent from a ``Responder`` thread so that a step never waits on a send.

Tokens are deterministic: the token after a sequence is a function of its
last token and its length only (``next_token``), kept in ``[3, vocab)`` and
never the request's ``end_id`` or ``pad_id``, so every request runs to its
``request_output_len``. A request with ``draft_input_ids`` is verified in one
step as TRT-LLM does: the draft's longest prefix that matches the engine's own
tokens is accepted, plus one token of the engine's own. So at any temperature
every mode yields the same tokens as the baseline, a draft engine served by
this model agrees with its target everywhere (acceptance 1.0), and the
temperature and seed are checked but change nothing. ``generation_logits``
rows are one-hot-like (the chosen token 10, the rest 0). numpy only: no
torch, no weights; ``config.json`` in ``gpt_model_path`` gives ``vocab_size``.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.runtime.cancel import POLL_S, Cancellation
from trtspec.runtime.engine import triton_model as reference
from trtspec.runtime.engine.triton_model import InputError, _first, _flag, _param, _required
from trtspec.runtime.limits import ParamError, check_sampling
from trtspec.runtime.threads import WORKAROUND, Responder

STEP_PARAMETER = "instant_step_ms"
FIRST_TOKEN = 3  # below: the special tokens of the tokenizers trtspec ships and tests


def next_token(last: int, length: int, vocab: int, avoid: tuple[int, ...] = ()) -> int:
    """The instant engine's token after a sequence of ``length`` tokens ending in ``last``."""
    span = max(1, vocab - FIRST_TOKEN)
    token = FIRST_TOKEN + (last * 31 + length * 17 + 7) % span
    while token in avoid:
        token = FIRST_TOKEN + (token - FIRST_TOKEN + 1) % span
    return token


class _Sequence:
    """One in-flight request."""

    def __init__(self, ids: list[int], max_new: int, draft: list[int], options: dict) -> None:
        self.ids = ids
        self.prompt_len = len(ids)
        self.max_new = max_new
        self.draft = draft
        self.options = options
        self.out: list[int] = []
        self.sender: Any = None
        self.cancel: Any = None
        self.arrival_ns = time.time_ns()
        self.first_ns = 0
        self.last_ns = 0
        self.accepted = 0

    def step(self, vocab: int) -> list[int]:
        """This step's new tokens: one, or a verified draft plus one."""
        avoid = self.options["avoid"]
        new: list[int] = []
        budget = self.max_new - len(self.out)
        drafts = self.draft if not self.out else []
        for i in range(len(drafts) + 1):
            if len(new) >= budget:
                break
            seq_len = len(self.ids) + len(new)
            last = new[-1] if new else (self.ids[-1] if self.ids else 0)
            token = next_token(last, seq_len, vocab, avoid)
            new.append(token)
            if i >= len(drafts) or drafts[i] != token:
                break
            self.accepted += 1
        self.ids.extend(new)
        self.out.extend(new)
        now = time.time_ns()
        self.first_ns = self.first_ns or now
        self.last_ns = now
        return new

    @property
    def finished(self) -> bool:
        return len(self.out) >= self.max_new


class TritonPythonModel:
    """The instant engine (see the module docstring)."""

    def initialize(self, args: dict[str, Any]) -> None:
        pb = reference.pb_utils
        config = json.loads(args["model_config"])
        self.decoupled = pb.using_decoupled_model_transaction_policy(config)
        self.step_s = float(_param(config, STEP_PARAMETER) or 0.0) / 1000.0
        self.exclude_default = _flag(_param(config, "exclude_input_in_output"), False)
        self.vocab = 32000
        path = _param(config, "gpt_model_path")
        engine_config = Path(path) / "config.json" if path else None
        if engine_config is not None and engine_config.is_file():
            data = json.loads(engine_config.read_text(encoding="utf-8"))
            model = data.get("pretrained_config") or data.get("model") or data
            self.vocab = int(model.get("vocab_size") or data.get("vocab_size") or self.vocab)
        self.steps = 0
        self._pending: list[_Sequence] = []
        self._active: list[_Sequence] = []
        self._lock = threading.Condition()
        self._closed = False
        # a step never waits on a send (as TensorRT-LLM's backend; see Responder)
        self.responder = Responder(log=pb.Logger.log_error)
        self._thread = threading.Thread(target=self._loop, name="instant-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ parse
    def _parse(self, request: Any) -> _Sequence:
        pb = reference.pb_utils
        lengths = _required(request, "input_lengths").reshape(-1)
        output_len = _required(request, "request_output_len").reshape(-1)
        ids = _required(request, "input_ids")
        batch = ids.shape[0] if ids.ndim > 1 else 1
        if batch != 1:
            raise InputError(
                f"batch size {batch} in one request is not supported by the "
                "reference engine: send one request per sequence"
            )
        ids = ids.reshape(-1)
        n = int(lengths[0]) if lengths.size else ids.size
        if n > ids.size or n < 0:
            raise InputError(
                f"input_lengths ({n}) is larger than the number of input_ids ({ids.size})"
            )
        draft = pb.get_input_tensor_by_name(request, "draft_input_ids")
        draft_ids = [int(t) for t in draft.as_numpy().reshape(-1)] if draft is not None else []
        seed_name = "random_seed" if _first(request, ("seed",), None) is None else "seed"
        try:
            check_sampling(
                temperature=float(_first(request, ("temperature",), 0.0)),
                top_p=float(_first(request, ("runtime_top_p",), 1.0)),
                top_k=int(_first(request, ("runtime_top_k",), 0)),
                seed=int(_first(request, ("seed", "random_seed"), 0)),
                names={"top_p": "runtime_top_p", "top_k": "runtime_top_k", "seed": seed_name},
            )
        except ParamError as exc:
            raise InputError(str(exc)) from None
        end_id = _first(request, ("end_id",), None)
        pad_id = _first(request, ("pad_id",), None)
        options = {
            "streaming": bool(_first(request, ("streaming",), False)),
            "exclude": bool(_first(request, ("exclude_input_in_output",), self.exclude_default)),
            "perf": bool(_first(request, ("return_perf_metrics",), False)),
            "logits": bool(_first(request, ("return_generation_logits",), False)),
            "avoid": tuple(int(v) for v in (end_id, pad_id) if v is not None),
            "outputs": set(request.requested_output_names() or ()),
        }
        if options["streaming"] and not self.decoupled:
            raise InputError(
                "Streaming is only supported if model is deployed using decoupled mode."
            )
        return _Sequence([int(t) for t in ids[:n]], int(output_len[0]), draft_ids, options)

    # --------------------------------------------------------------- respond
    def _response(self, seq: _Sequence, tokens: list[int]) -> Any:
        pb = reference.pb_utils
        tensors = [
            pb.Tensor("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, 1, -1)),
            pb.Tensor("sequence_length", np.array([[len(tokens)]], dtype=np.int32)),
        ]
        if seq.options["logits"]:
            rows = np.zeros((len(tokens), self.vocab), dtype=np.float32)
            if tokens:
                rows[np.arange(len(tokens)), np.asarray(tokens) % self.vocab] = 10.0
            tensors.append(pb.Tensor("generation_logits", rows.reshape(1, 1, -1, self.vocab)))
        wanted = seq.options["outputs"]
        if seq.options["perf"]:
            drafted = len(seq.draft)
            values = {
                "kv_cache_alloc_new_blocks": (0, np.int32),
                "kv_cache_reused_blocks": (0, np.int32),
                "kv_cache_alloc_total_blocks": (0, np.int32),
                "arrival_time_ns": (seq.arrival_ns, np.int64),
                "first_scheduled_time_ns": (seq.arrival_ns, np.int64),
                "first_token_time_ns": (seq.first_ns, np.int64),
                "last_token_time_ns": (seq.last_ns, np.int64),
                "acceptance_rate": (seq.accepted / drafted if drafted else 0.0, np.float32),
                "total_accepted_draft_tokens": (seq.accepted, np.int32),
                "total_draft_tokens": (drafted, np.int32),
            }
            tensors += [  # only those asked for (triton_model._perf_tensors)
                pb.Tensor(k, np.array([[v]], dtype=dt))
                for k, (v, dt) in values.items()
                if not (wanted and WORKAROUND) or k in wanted
            ]
        if wanted and WORKAROUND:  # see triton_model._response
            tensors = [t for t in tensors if t.name() in wanted]
        return pb.InferenceResponse(output_tensors=tensors)

    def _error(self, exc: BaseException) -> Any:
        pb = reference.pb_utils
        code = (
            pb.TritonError.INVALID_ARG if isinstance(exc, InputError) else pb.TritonError.INTERNAL
        )
        return pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(exc), code))

    def _end(self, seq: _Sequence, delta: list[int]) -> None:
        """Answer a finished (or cancelled) sequence's last response."""
        pb = reference.pb_utils
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            if seq.cancel.is_cancelled():
                if seq.options["streaming"] or self.decoupled:
                    seq.sender.send(flags=final)
                else:
                    error = pb.TritonError("request cancelled", pb.TritonError.CANCELLED)
                    response = pb.InferenceResponse(output_tensors=[], error=error)
                    seq.sender.send(response, flags=final)
            elif seq.options["streaming"]:
                seq.sender.send(self._response(seq, delta), flags=final)
            else:
                tokens = seq.out if seq.options["exclude"] else seq.ids
                seq.sender.send(self._response(seq, list(tokens)), flags=final)
        finally:
            seq.cancel.close()

    # ----------------------------------------------------------------- steps
    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._pending and not self._active:
                    self._lock.wait()
                if self._closed:
                    return
                self._active.extend(self._pending)
                self._pending.clear()
            started = time.monotonic()
            self.steps += 1
            still: list[_Sequence] = []
            for seq in self._active:
                try:
                    if seq.cancel.is_cancelled():
                        self._end(seq, [])
                        continue
                    delta = seq.step(self.vocab)
                    if seq.finished:
                        self._end(seq, delta)
                        continue
                    if seq.options["streaming"]:
                        seq.sender.send(self._response(seq, delta), flags=0)
                    still.append(seq)
                except Exception as exc:  # a bug fails this request, not the model
                    final = reference.pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
                    seq.sender.send(self._error(exc), flags=final)
            self._active = still
            # The next step starts a step after this one; an idle engine starts
            # one as soon as a request arrives (a request arriving mid-step
            # waits for the step boundary, as in-flight batching does).
            wait = self.step_s - (time.monotonic() - started)
            if wait > 0 and still:
                time.sleep(wait)

    def execute(self, requests: list[Any]) -> None:
        pb = reference.pb_utils
        for request in requests:
            sender = request.get_response_sender()
            cancel = Cancellation.of(request, sender if self.decoupled else request, poll_s=POLL_S)
            try:
                seq = self._parse(request)
            except Exception as exc:
                cancel.close()
                sender.send(self._error(exc), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            # answers leave from the responder's thread: a step never waits on a send
            seq.sender, seq.cancel = self.responder.sender(sender), cancel
            if seq.max_new <= 0:
                self._end(seq, [])
                continue
            with self._lock:
                self._pending.append(seq)
                self._lock.notify()

    def finalize(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=5)
        self.responder.close()
