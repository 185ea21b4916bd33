"""The per-variant orchestrator Python model (decoupled, one per variant plus
``baseline``): tokenizes through ``preprocessing``, generates, streams text
deltas detokenized through ``postprocessing``, and ends every request with one
final response carrying the stats of docs/design/orchestrator.md.

For ``draft_model`` and ``ngram`` it runs the draft → verify loop itself over
BLS (non-decoupled engines): each round drafts ``k`` tokens (draft engine or
prompt lookup; ``k`` follows the variant's ``draft_schedule``), asks the
target to verify them, counts drafted and accepted tokens, and streams that
round's accepted tokens — the upstream BLS can do neither. With
``use_draft_logits`` it asks the draft for ``generation_logits`` and forwards
the rows of the drafted tokens to the target as ``draft_logits`` (upstream
BLS ``_spec_generate``), so the target accepts by speculative sampling
instead of matching. For the baseline
and the in-engine modes (medusa, eagle, lookahead) it forwards one streaming
request to the decoupled engine with ``return_perf_metrics`` and reads the
engine's draft/accepted totals. It always sends ``exclude_input_in_output``
and tracks the sequence itself, and calls models only by the names in its
config ``parameters`` (no host, no port).

Lengths: every round of a draft loop re-sends prompt + output, so its engines
are built for inputs up to ``max_seq_len - 1`` (parameter ``max_input_len``,
trtspec.modes.draft_model.loop_engine_target), while prompts stay limited to
the baseline's ``max_prompt_len`` and prompt + max_tokens to ``max_seq_len``
(refused up front, in the engine's words, as the baseline's engine refuses
them; clamped instead where ``clamp_max_tokens`` says the engine clamps, as
TensorRT-LLM does). Where the next round would not fit the engines' input
length (an engine built before this rule), the loop stops drafting and the
target generates the rest in one plain call from the sequence that still fits.

Streaming: a streamed request's first text goes out as soon as it is
complete; after that, with the config parameter ``stream_interval`` N > 1
(the spec's ``flow.stream_interval``; absent = 1), a response goes out once
at least N more tokens have arrived, and the final response carries the
rest, as TensorRT-LLM's PyTorch flow answers at its first iteration and every
N-th. The tokens and text are the same; there are fewer, fuller responses,
each hop's cost per token is divided by about N, and what the client
measures per token (time between responses over their tokens) is unchanged.
Tokens held when the generation fails go out before its error.

Deadlines: every BLS call is bounded in this model (``threads.call_within``,
``threads.ExecStream``), whatever the callee does. A failure after text
was streamed to the router (a BLS caller) is sent as a final response with
an ``error`` tensor, because on 2.51 an error response after streamed ones
never reaches a BLS caller; a client called directly gets the error itself.

Bad request values (``trtspec.runtime.limits``) and a callee's ``INVALID_ARG`` are
answered as ``INVALID_ARG`` with the message ``<variant>: invalid request:
…`` — the client's error, which the router never retries; anything else is a
server-side failure. A cancelled request (its
client's, or the router's through ``trtspec.runtime.cancel``) stops before the next
round or engine step and ends with an empty final response.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.catalogue import DRAFT_LOOP_MODES, MODES
from trtspec.procutil import skip_interpreter_teardown
from trtspec.runtime import heartbeat
from trtspec.runtime.cancel import POLL_S, Cancellation, Cancelled, cancel_stream
from trtspec.runtime.health import watch
from trtspec.runtime.limits import (
    ParamError,
    check,
    draft_tokens_problem,
)
from trtspec.runtime.models.protocol import (
    RequestParams,
    callee_error,
    end_cancelled,
    error_reply,
    wants_text,
)
from trtspec.runtime.speculate import (
    DEFAULT_CONFIDENCE_THRESHOLD,
    DraftSchedule,
    RoundStats,
    accepted_count,
    draft_budget,
    draft_call_seed,
    draft_until_unsure,
    position_counts,
    propose_ngram,
    round_finished,
    round_seed,
    token_probability,
)
from trtspec.runtime.text import IncrementalText, LocalText
from trtspec.runtime.threads import (
    BlsStreams,
    ExecStream,
    PruningSender,
    RequestThreads,
    call_within,
    stream_timeout_us,
    string_params,
)

PERF_TOTALS = ("total_draft_tokens", "total_accepted_draft_tokens")
REUSED_BLOCKS = "kv_cache_reused_blocks"
# BLS calls carry a deadline so a callee that never answers fails this request
# with an error instead of hanging it (and the client) forever. One call is a
# single verify/draft/detokenize step; a stream is a whole generation, whose
# deadline follows its max_tokens (threads.stream_timeout_us).
CALL_TIMEOUT_US = 120 * 1_000_000


def _cut_at_end(ids: list[int], end_id: int | None) -> list[int]:
    if end_id is not None and end_id in ids:
        return ids[: ids.index(end_id)]
    return ids


class _Generation:
    """One request's state: the sequence, the text stream and the stats."""

    def __init__(
        self,
        model: TritonPythonModel,
        params: RequestParams,
        sender: Any,
        start_ns: int,
        cancel: Cancellation,
    ) -> None:
        self.model = model
        self.params = params
        self.sender = sender
        self.cancel = cancel
        self.start_ns = start_ns
        self.first_token_ns: int | None = None
        self.text = IncrementalText(self._decode)
        self.pending: list[int] = []  # ids of the next response (output_ids)
        # ids not yet detokenized: held until stream_interval of them arrived
        self.held: list[int] = []
        self.streamed = False  # a response with text (or, without text, ids) went out
        # False when the client did not ask for text_output (protocol.wants_text):
        # streamed responses carry ids only and nothing is decoded until the end
        self.wants_text = True
        self.completion = 0
        self.stats = RoundStats()
        self.end_id: int | None = None
        self.pad_id: int | None = None
        self.engine_draft: int | None = None
        self.engine_accepted: int | None = None
        # Blocks the target engine reused at this request's first call (None
        # until that call answered, or when the engine reports no perf metrics).
        self.reused_blocks: int | None = None
        self.sent = 0  # responses sent to the caller so far
        # The outputs the client asked for (empty: all), as the sender prunes
        # to them (threads.PruningSender.wanted): a streamed response is built
        # of those alone and sent with send_exact, which skips the pruning
        # sender's look at every tensor (~25 µs a response in the router).
        self.wanted: frozenset[str] = getattr(sender, "wanted", frozenset())
        self._send_exact = getattr(sender, "send_exact", sender.send)
        # time.monotonic() by which the whole request must end: the router's
        # deadline when it runs this generation in its own process
        # (inprocess.py); None = each call's own deadline only.
        self.deadline: float | None = None
        # why this variant will not answer once the watchdog marked it down
        # (trtspec.runtime.health.watch): every engine call then ends at once
        self.down: Callable[[], str | None] | None = None

    # -- BLS helpers -------------------------------------------------------
    def _call(self, model_name: str, tensors: list, outputs: list[str]) -> Any:
        request = pb_utils.InferenceRequest(
            model_name=model_name,
            inputs=tensors,
            requested_output_names=outputs,
            timeout=CALL_TIMEOUT_US,
            parameters=self.cancel.parameters(),
        )
        timeout_s = CALL_TIMEOUT_US / 1e6
        if self.deadline is not None:
            timeout_s = min(timeout_s, max(0.0, self.deadline - time.monotonic()))
        response = call_within(request.exec, timeout_s, model_name, self.down)
        if response.has_error():
            raise callee_error(model_name, response.error())
        return response

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        if self.model.text is not None:  # in process: no BLS call per token
            return self.model.text.decode(ids)
        tokens = np.asarray([ids], dtype=np.int32).reshape(1, len(ids))
        response = self._call(
            self.model.postprocessing_model,
            [
                pb_utils.Tensor("TOKENS_BATCH", tokens),
                pb_utils.Tensor("SEQUENCE_LENGTH", np.array([len(ids)], dtype=np.int32)),
            ],
            ["OUTPUT"],
        )
        out = pb_utils.get_output_tensor_by_name(response, "OUTPUT").as_numpy().reshape(-1)
        if not out.size:
            return ""
        text = out[0]  # our own postprocessing: its bytes are UTF-8
        return text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)

    def tokenize(self) -> tuple[list[int], int | None, int | None]:
        if self.model.text is not None:  # in process, as preprocessing would answer
            text = self.model.text
            return text.encode(self.params.text), text.end_id, text.pad_id
        response = self._call(
            self.model.preprocessing_model,
            [
                pb_utils.Tensor(
                    "QUERY", np.array([self.params.text.encode("utf-8")], dtype=np.object_)
                ),
                pb_utils.Tensor(
                    "REQUEST_OUTPUT_LEN", np.array([self.params.max_tokens], dtype=np.int32)
                ),
            ],
            ["INPUT_ID", "OUT_END_ID", "OUT_PAD_ID"],
        )

        def get(name: str) -> np.ndarray:
            return pb_utils.get_output_tensor_by_name(response, name).as_numpy().reshape(-1)

        ids = [int(t) for t in get("INPUT_ID")]
        end_id, pad_id = int(get("OUT_END_ID")[0]), int(get("OUT_PAD_ID")[0])
        return ids, (end_id if end_id >= 0 else None), (pad_id if pad_id >= 0 else None)

    def engine_inputs(
        self,
        sequence: list[int],
        output_len: int,
        *,
        streaming: bool,
        draft: list[int] | None = None,
        draft_logits: np.ndarray | None = None,
        return_logits: bool = False,
        seed: int | None = None,
    ) -> list:
        p, m = self.params, self.model
        seed = p.seed if seed is None else seed

        def one(name: str, value: Any, dtype: Any) -> Any:
            return pb_utils.Tensor(name, np.array([[value]], dtype=dtype))

        tensors = [
            pb_utils.Tensor("input_ids", np.asarray([sequence], dtype=np.int32)),
            one("input_lengths", len(sequence), np.int32),
            one("request_output_len", output_len, np.int32),
            one("streaming", streaming, np.bool_),
            # Always explicit: the orchestrator tracks the sequence itself.
            one("exclude_input_in_output", True, np.bool_),
        ]
        if self.end_id is not None:
            tensors.append(one("end_id", self.end_id, np.int32))
        if self.pad_id is not None:
            tensors.append(one("pad_id", self.pad_id, np.int32))
        if p.temperature is not None:
            tensors.append(one("temperature", p.temperature, np.float32))
        if p.top_k is not None:
            tensors.append(one("runtime_top_k", p.top_k, np.int32))
        if p.top_p is not None:
            tensors.append(one("runtime_top_p", p.top_p, np.float32))
        if seed is not None:
            tensors.append(one(m.seed_input, seed, np.uint64))
        if m.perf_metrics or m.reuse_stats_input:
            # return_perf_metrics (0.19 on) or return_kv_cache_reuse_stats (0.17, 0.18)
            tensors.append(one(m.reuse_stats_input or "return_perf_metrics", True, np.bool_))
        if draft:
            tensors.append(pb_utils.Tensor("draft_input_ids", np.asarray([draft], dtype=np.int32)))
            if draft_logits is not None:
                # [1, k, vocab]: the draft's rows for exactly the drafted tokens
                tensors.append(pb_utils.Tensor("draft_logits", draft_logits[None]))
        if return_logits:
            tensors.append(one("return_generation_logits", True, np.bool_))
        return tensors

    def engine_outputs(self, *, logits: bool = False) -> list[str]:
        names = ["output_ids", "sequence_length"]
        if logits:
            names.append("generation_logits")
        if self.model.perf_metrics:
            # the engine's draft totals only where the engine drafts (the
            # baseline has none, a draft loop counts its own): two tensors
            # fewer in every streamed response otherwise
            mode = MODES.get(self.model.mode)
            totals = PERF_TOTALS if mode is not None and not mode.draft_loop else ()
            return [*names, *totals, REUSED_BLOCKS]
        return [*names, REUSED_BLOCKS] if self.model.reuse_stats_input else names

    def target_tokens(self, response: Any) -> list[int] | None:
        """``tokens_of`` a target engine's answer, keeping its reused-block
        count from the request's first answer only (later rounds of a draft
        loop reuse this request's own blocks)."""
        outputs = {t.name(): t for t in response.output_tensors()}
        tensor = outputs.get(REUSED_BLOCKS)
        if self.reused_blocks is None and tensor is not None and tensor.as_numpy().size:
            self.reused_blocks = int(tensor.as_numpy().reshape(-1)[0])
        return self._tokens(outputs)

    @staticmethod
    def draft_rows(response: Any, drafted: int) -> np.ndarray | None:
        """The last ``drafted`` rows of the draft's ``generation_logits``
        ([1, beam 1, n, vocab] → [drafted, vocab]), as the upstream BLS slices them."""
        tensor = pb_utils.get_output_tensor_by_name(response, "generation_logits")
        if tensor is None or drafted == 0:
            return None
        rows = tensor.as_numpy()
        rows = rows.reshape(-1, rows.shape[-1])
        if rows.shape[0] < drafted:
            raise RuntimeError(
                f"the draft returned {rows.shape[0]} rows of generation_logits "
                f"for {drafted} draft tokens"
            )
        return np.ascontiguousarray(rows[-drafted:])

    def tokens_of(self, response: Any) -> list[int] | None:
        # one output_tensors() per response (pb_utils.get_output_tensor_by_name
        # builds the whole list for every name it looks up, every token)
        return self._tokens({t.name(): t for t in response.output_tensors()})

    def _tokens(self, outputs: dict[str, Any]) -> list[int] | None:
        out = outputs.get("output_ids")
        if out is None:
            return None
        ids = out.as_numpy().reshape(-1).tolist()
        length = outputs.get("sequence_length")
        if length is not None:
            values = length.as_numpy().reshape(-1)
            if values.size:
                ids = ids[: max(0, int(values[0]))]
        for name in PERF_TOTALS:
            tensor = outputs.get(name)
            if tensor is not None and tensor.as_numpy().size:
                value = int(tensor.as_numpy().reshape(-1)[0])
                if name == "total_draft_tokens":
                    self.engine_draft = value
                else:
                    self.engine_accepted = value
        return ids

    # -- output ------------------------------------------------------------
    def emit(self, ids: list[int]) -> None:
        if not ids:
            return
        if self.first_token_ns is None:
            self.first_token_ns = time.monotonic_ns()
        self.completion += len(ids)
        self.pending.extend(ids)
        if not self.params.stream:
            self.text.ids.extend(ids)
            return
        self.held.extend(ids)
        # stream_interval (module docstring): the first text at once, then a
        # response once that many tokens arrived since the last one
        if self.streamed and len(self.held) < self.model.stream_interval:
            return
        self.release()

    def release(self) -> None:
        """Send the text of the held ids now (what is complete of it); to a
        client that did not ask for text, the held ids."""
        if not self.held:
            return
        if not self.wants_text:
            # the ids as they are; the final response's text is flush()'s
            self.text.ids.extend(self.held)
            self.held = []
            self.send("", final=False)
            self.streamed = True
            return
        delta = self.text.push(self.held)
        self.held = []
        if delta:
            self.send(delta, final=False)
            self.streamed = True

    def send(self, text: str, *, final: bool, prompt_tokens: int = 0) -> None:
        if final:
            self._send_final(text, prompt_tokens)
        else:
            self._send_streamed(text)

    def _send_final(self, text: str, prompt_tokens: int) -> None:
        """The final response: the rest of the text and ids, and the stats."""
        now = time.monotonic_ns()
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("output_ids", np.asarray(self.pending, dtype=np.int32)),
            pb_utils.Tensor("is_final", np.array([True], dtype=np.bool_)),
        ]
        self.pending = []
        draft, accepted = self.stats.draft_tokens, self.stats.accepted_tokens
        if self.model.mode not in DRAFT_LOOP_MODES:
            draft, accepted = self.engine_draft or 0, self.engine_accepted or 0
        first = self.first_token_ns if self.first_token_ns is not None else now
        stats = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": self.completion,
            "draft_tokens": draft,
            "accepted_tokens": accepted,
            "rounds": self.stats.rounds,
            "prefix_reused_tokens": (
                -1
                if self.reused_blocks is None
                else self.reused_blocks * self.model.tokens_per_block
            ),
        }
        tensors.extend(pb_utils.Tensor(k, np.array([v], dtype=np.int32)) for k, v in stats.items())
        positions = (
            position_counts(self.stats.per_round)
            if self.model.mode in DRAFT_LOOP_MODES
            else ([], [])
        )
        tensors.append(
            pb_utils.Tensor(
                "position_acceptance", np.asarray(positions, dtype=np.int32).reshape(2, -1)
            )
        )
        ttft, total = first - self.start_ns, now - self.start_ns
        tensors += [
            pb_utils.Tensor("server_ttft_ns", np.array([ttft], dtype=np.int64)),
            pb_utils.Tensor("server_total_ns", np.array([total], dtype=np.int64)),
            pb_utils.Tensor(
                "variant", np.array([self.model.variant.encode("utf-8")], dtype=np.object_)
            ),
            pb_utils.Tensor("fallback", np.array([False], dtype=np.bool_)),
        ]
        self.sender.send(
            pb_utils.InferenceResponse(output_tensors=tensors),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
        self.sent += 1

    def _send_streamed(self, text: str) -> None:
        """A response before the final one: the text (to a client that wants
        it) and the ids since the last response, only the outputs asked for."""
        wanted = self.wanted
        tensors = []
        if self.wants_text:
            text_array = np.array([text.encode("utf-8")], dtype=np.object_)
            tensors.append(pb_utils.Tensor("text_output", text_array))
        if not wanted or "output_ids" in wanted:
            tensors.append(pb_utils.Tensor("output_ids", np.asarray(self.pending, dtype=np.int32)))
        if not wanted or "is_final" in wanted:
            tensors.append(pb_utils.Tensor("is_final", np.array([False], dtype=np.bool_)))
        self.pending = []
        self._send_exact(pb_utils.InferenceResponse(output_tensors=tensors), flags=0)
        self.sent += 1

    def send_error_final(self, message: str) -> None:
        """End a request that already streamed with its error in band (see the
        module docstring): a final response carrying ``error``."""
        tensors = [
            pb_utils.Tensor("text_output", np.array([b""], dtype=np.object_)),
            pb_utils.Tensor("is_final", np.array([True], dtype=np.bool_)),
            pb_utils.Tensor("error", np.array([message.encode("utf-8")], dtype=np.object_)),
        ]
        self.sender.send(
            pb_utils.InferenceResponse(output_tensors=tensors),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    # -- generation ----------------------------------------------------------
    def run(self) -> None:
        num_draft = self.draft_len() if self.model.mode in DRAFT_LOOP_MODES else 0
        prompt, self.end_id, self.pad_id = self.tokenize()
        try:
            if self.model.mode in DRAFT_LOOP_MODES:
                self.draft_loop(prompt, num_draft)
            else:
                self.forward_streaming(prompt)
        except Cancelled:
            raise
        except Exception:
            # what was generated before the failure goes out before its error
            with contextlib.suppress(Exception):
                self.release()
            raise
        self.text.ids.extend(self.held)  # the final response carries the rest
        self.held = []
        self.send(self.text.flush(), final=True, prompt_tokens=len(prompt))

    def draft_len(self) -> int:
        m, p = self.model, self.params
        if p.num_draft_tokens is None:
            return m.num_draft_tokens
        return int(
            check("num_draft_tokens", p.num_draft_tokens, draft_tokens_problem, m.max_draft_len)
        )

    def check_lengths(self, prompt: list[int]) -> None:
        """Refuse (or clamp) up front what the baseline's engine refuses (or
        clamps), in its words, so the loop never fails on it mid-stream."""
        m, p, n = self.model, self.params, len(prompt)
        if m.max_prompt_len is not None and n > m.max_prompt_len:
            raise ParamError(
                f"Prompt length ({n}) exceeds maximum input length ({m.max_prompt_len})."
            )
        if m.max_seq_len is not None and n + p.max_tokens > m.max_seq_len:
            if not m.clamp_max_tokens or n >= m.max_seq_len:
                raise ParamError(
                    f"Prompt length + number of requested output tokens ({n} + {p.max_tokens}) "
                    f"exceeds maximum sequence length ({m.max_seq_len})."
                )
            p.max_tokens = m.max_seq_len - n

    def draft_loop(self, prompt: list[int], num_draft: int) -> None:
        m, p = self.model, self.params
        self.check_lengths(prompt)
        schedule = DraftSchedule(num_draft, m.draft_schedule, m.draft_confidence_threshold)
        sequence = list(prompt)
        sampling = p.temperature is not None and p.temperature > 0
        while self.completion < p.max_tokens:
            if self.cancel.is_cancelled():
                raise Cancelled
            remaining = p.max_tokens - self.completion
            k = draft_budget(schedule.next(), m.max_draft_len, remaining)
            seeds: tuple[int | None, int | None] = (None, None)
            if sampling:
                base, r = p.seed or 0, self.stats.rounds
                seeds = (round_seed(base, r, 0), round_seed(base, r, 1))
            limit = m.loop_input_len
            if limit is not None and len(sequence) + k + 1 > limit and remaining > k + 1:
                # After this round the sequence could outgrow what the engines
                # take; finish now, from a sequence that still fits.
                self.finish_plain(sequence, remaining, seeds[1])
                break
            draft: list[int] = []
            rows = None
            if k > 0 and m.mode == "ngram":
                draft = propose_ngram(sequence, k, m.max_matching_ngram_size)
            elif k > 0 and m.draft_model is not None and schedule.stepwise:
                draft, rows = self.draft_until_unsure(sequence, k, schedule.threshold, seeds[0])
            elif k > 0 and m.draft_model is not None:
                response = self._call(
                    m.draft_model,
                    self.engine_inputs(
                        sequence,
                        k,
                        streaming=False,
                        return_logits=m.use_draft_logits,
                        seed=seeds[0],
                    ),
                    self.engine_outputs(logits=m.use_draft_logits),
                )
                draft = (self.tokens_of(response) or [])[:k]
                if m.use_draft_logits:
                    rows = self.draft_rows(response, len(draft))
            response = self._call(
                m.target_model,
                self.engine_inputs(
                    sequence,
                    len(draft) + 1,
                    streaming=False,
                    draft=draft,
                    draft_logits=rows,
                    seed=seeds[1],
                ),
                self.engine_outputs(),
            )
            verified = self.target_tokens(response) or []
            accepted = min(accepted_count(draft, verified), len(draft))
            self.stats.record(len(draft), accepted)
            schedule.update(len(draft), accepted)
            kept = _cut_at_end(verified, self.end_id)[:remaining]
            sequence.extend(kept)
            self.emit(kept)
            if round_finished(draft, verified, self.end_id):
                break

    def draft_until_unsure(
        self, sequence: list[int], cap: int, threshold: float, seed: int | None
    ) -> tuple[list[int], np.ndarray | None]:
        """The confidence schedule's draft (``speculate.draft_until_unsure``):
        one draft engine call per token, each returning its logits row, until
        the draft's probability of its token falls below ``threshold`` or
        ``cap`` tokens; with the rows of the drafted tokens when the target
        accepts by logits."""
        m, temperature, draft_model = self.model, self.params.temperature, self.model.draft_model
        assert draft_model is not None
        rows: list[np.ndarray] = []

        def next_token(draft: list[int]) -> tuple[int, float] | None:
            response = self._call(
                draft_model,
                self.engine_inputs(
                    [*sequence, *draft],
                    1,
                    streaming=False,
                    return_logits=True,
                    seed=None if seed is None else draft_call_seed(seed, len(draft)),
                ),
                self.engine_outputs(logits=True),
            )
            tokens = (self.tokens_of(response) or [])[:1]
            if not tokens:
                return None  # the draft's end token: nothing to propose
            row = self.draft_rows(response, 1)
            if row is None:
                raise RuntimeError(
                    f"{draft_model} returned no generation_logits; draft_schedule "
                    "confidence reads the draft's probabilities (tensorrt_llm: build the "
                    "draft engine with --gather_generation_logits, as trtspec's plan does)"
                )
            rows.append(row[0])
            return tokens[0], token_probability(row[0], tokens[0], temperature)

        draft = draft_until_unsure(next_token, cap, threshold)
        if not (m.use_draft_logits and draft):
            return draft, None
        return draft, np.ascontiguousarray(np.stack(rows[: len(draft)]))

    def finish_plain(self, sequence: list[int], remaining: int, seed: int | None) -> None:
        """The rest of the answer as plain decoding: one target call without
        drafts (a round whose draft was empty, ``remaining`` tokens long)."""
        m = self.model
        pb_utils.Logger.log_info(
            f"{m.variant}: the sequence ({len(sequence)} tokens) nears the engines' "
            f"max_input_len ({m.loop_input_len}); the last {remaining} tokens are "
            "generated without drafts"
        )
        response = self._call(
            m.target_model,
            self.engine_inputs(sequence, remaining, streaming=False, seed=seed),
            self.engine_outputs(),
        )
        kept = _cut_at_end(self.target_tokens(response) or [], self.end_id)[:remaining]
        self.stats.record(0, 0)
        sequence.extend(kept)
        self.emit(kept)

    def forward_streaming(self, prompt: list[int]) -> None:
        m, p = self.model, self.params
        request = pb_utils.InferenceRequest(
            model_name=m.target_model,
            inputs=self.engine_inputs(prompt, p.max_tokens, streaming=True),
            requested_output_names=self.engine_outputs(),
            timeout=stream_timeout_us(p.max_tokens),
            parameters=self.cancel.parameters(),
        )
        deadline = time.monotonic() + stream_timeout_us(p.max_tokens) / 1e6
        if self.deadline is not None:
            deadline = min(deadline, self.deadline)
        # exec() (which on 2.51 returns with the first response) and the pump of
        # its responses run on one worker thread; what arrived while the last
        # batch was answered comes as one batch and goes out as one response
        # (several tokens): under load, fewer sends.
        call = ExecStream(
            lambda: request.exec(decoupled=True),
            max(0.0, deadline - time.monotonic()),
            m.target_model,
            keep=m.streams.keep,  # see threads.BlsStreams: the 2.51 stub crash
            down=self.down,
        )
        stream = call.batches
        for batch in stream:
            if self.cancel.is_cancelled():
                # The engine stops at its next step (it sees the flag); wait
                # for its last answer so nothing of this request outlives it.
                cancel_stream(call.responses)
                for _ in stream:
                    pass
                raise Cancelled
            kept: list[int] = []
            for response in batch:
                if response.has_error():
                    self.emit(kept)  # what came before the error
                    raise callee_error(m.target_model, response.error())
                ids = self.target_tokens(response)
                if not ids:
                    continue
                remaining = p.max_tokens - self.completion - len(kept)
                step = _cut_at_end(ids, self.end_id)[:remaining]
                if step:
                    self.stats.rounds += 1
                    kept.extend(step)
            self.emit(kept)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = string_params(config)
        self.variant = params["variant"]
        self.mode = params["mode"]
        self.preprocessing_model = params["preprocessing_model"]
        self.postprocessing_model = params["postprocessing_model"]
        self.target_model = params["target_model"]
        self.draft_model = params.get("draft_model") or None
        self.max_draft_len = int(params.get("max_draft_len") or 0)
        self.num_draft_tokens = int(params.get("num_draft_tokens") or self.max_draft_len)
        self.max_matching_ngram_size = int(params.get("max_matching_ngram_size") or 3)
        self.draft_schedule = params.get("draft_schedule") or "constant"
        self.draft_confidence_threshold = float(
            params.get("draft_confidence_threshold") or DEFAULT_CONFIDENCE_THRESHOLD
        )
        self.use_draft_logits = params.get("use_draft_logits", "false").lower() == "true"
        self.seed_input = params.get("seed_input") or "seed"
        self.perf_metrics = params.get("perf_metrics", "true").lower() == "true"
        # the input that asks for kv_cache_reused_blocks ("" = none: older repositories)
        self.reuse_stats_input = params.get("reuse_stats_input") or (
            "return_perf_metrics" if self.perf_metrics else ""
        )
        self.tokens_per_block = int(params.get("tokens_per_block") or 0)
        # tokenizer_dir set: tokenize and detokenize here (trtspec.runtime.text.LocalText)
        self.text = LocalText.of_params(params)
        # Lengths (module docstring); absent in a repository assembled before
        # them: the engines then refuse what they refuse, as before.
        self.max_prompt_len = _int_param(params, "max_prompt_len")
        self.max_seq_len = _int_param(params, "max_seq_len")
        self.loop_input_len = _int_param(params, "max_input_len")
        self.clamp_max_tokens = params.get("clamp_max_tokens", "false").lower() == "true"
        try:
            self.stream_interval = int(params.get("stream_interval") or 1)
        except ValueError:
            self.stream_interval = 0
        if self.stream_interval < 1:
            raise pb_utils.TritonModelException(
                f"{config.get('name')}: parameter stream_interval must be a positive "
                f"integer, got {params.get('stream_interval')!r}"
            )
        if self.mode == "draft_model" and not self.draft_model:
            raise pb_utils.TritonModelException(
                f"{config.get('name')}: mode draft_model needs the draft_model parameter"
            )
        try:
            # the one place that knows the names and the threshold's range
            DraftSchedule(0, self.draft_schedule, self.draft_confidence_threshold)
        except ValueError as exc:
            raise pb_utils.TritonModelException(
                f"{config.get('name')}: parameter draft_schedule: {exc}"
            ) from None
        if self.draft_schedule == "confidence" and self.mode != "draft_model":
            raise pb_utils.TritonModelException(
                f"{config.get('name')}: parameter draft_schedule: 'confidence' needs a "
                f"draft model's probabilities; mode {self.mode} has none"
            )
        self._requests = RequestThreads()
        self.streams = BlsStreams()
        # it calls decoupled BLS from several threads: the 2.51 stub can
        # deadlock, and the watchdog learns of it from this (trtspec.runtime.heartbeat)
        heartbeat.start()

    def execute(self, requests: list) -> None:
        # Decoupled: answer through each request's sender from a thread, so a
        # long generation does not block the requests queued behind it.
        for request in requests:
            self._requests.start(self._serve, request)

    def _serve(self, request: Any) -> None:
        start_ns = time.monotonic_ns()
        sender = request.get_response_sender()
        cancel = Cancellation.of(request, sender, poll_s=POLL_S)
        sender = PruningSender.wrap(sender, request, pb_utils.InferenceResponse)
        gen: _Generation | None = None
        try:
            params = RequestParams.from_request(request)
            gen = _Generation(self, params, sender, start_ns, cancel)
            gen.wants_text = wants_text(request)
            gen.down = watch(self.variant)
            gen.run()
        except Cancelled:
            assert gen is not None  # only a running generation checks for a cancel
            pb_utils.Logger.log_info(
                f"{self.variant}: request cancelled after {gen.completion} of "
                f"{gen.params.max_tokens} tokens ({gen.stats.rounds} rounds)"
            )
            end_cancelled(sender)
        except Exception as exc:
            reply = error_reply(self.variant, exc)
            if gen is not None and gen.sent and cancel.from_caller:
                gen.send_error_final(reply.message())
            else:
                sender.send(
                    pb_utils.InferenceResponse(error=reply),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
        finally:
            cancel.close()

    def finalize(self) -> None:
        self._requests.join()
        self.streams.close()
        skip_interpreter_teardown()  # the stub's exit counts in the server's stop time


def _int_param(params: dict[str, str], name: str) -> int | None:
    value = params.get(name) or ""
    return int(value) if value.strip() else None
