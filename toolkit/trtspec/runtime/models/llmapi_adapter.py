"""The per-variant model of the LLM-API flow (decoupled, one per variant plus
``baseline``): the orchestrator's tensors (docs/design/orchestrator.md) in front of
one TensorRT-LLM ``llmapi`` model (``llm_model`` parameter: upstream's model
on a GPU, ``trtspec.runtime.engine.llmapi_model`` on CPU), so the router, the bench and
everything else of trtspec stay the same for both flows.

It forwards one streaming request (``text_input``, ``streaming``,
``sampling_param_*``, perf metrics on). Every streamed ``text_output`` of the
llmapi model is the whole text so far, not a delta (upstream's
``_create_response`` sends ``CompletionOutput.text``; see
``text.CumulativeText`` for the file and commits), so the adapter relays what
each response adds to the one before and nothing for a response that repeats
it. The llmapi contract returns text only (no token ids), so on the final
response it re-tokenizes the model's last whole text with the target's
tokenizer for ``output_ids`` and ``completion_tokens`` (and the prompt for
``prompt_tokens``). Draft and
accepted totals come from the model's acceptance outputs where the pinned
TensorRT-LLM fills them (``acceptance`` parameter ``available``); where it
zeroes them they are left out of the response, which the bench reports as
not available, never as 0. ``rounds`` and ``prefix_reused_tokens`` are not in
the contract and are left out too. The LLM API fixes the draft length per
model (``max_draft_len``, ``draft_len_schedule``): a request's
``num_draft_tokens`` is accepted and not used.

The call is bounded by the request's deadline in this model
(``threads.ExecStream``, whatever the llmapi model does), and deltas that
arrived while the last one was being answered go out as one response. The
router runs this model's ``_run`` in its own process (``inprocess.py``), one
Python hop fewer per streamed delta; the model itself serves the bench's
direct calls, the fallback retry and other clients.
"""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.runtime import heartbeat
from trtspec.runtime.cancel import Cancellation, Cancelled, cancel_stream
from trtspec.runtime.contract import LLMAPI_ACCEPTANCE_AVAILABLE
from trtspec.runtime.health import watch
from trtspec.runtime.models.protocol import (
    RequestParams,
    callee_error,
    end_cancelled,
    error_reply,
)
from trtspec.runtime.threads import (
    BlsStreams,
    ExecStream,
    PruningSender,
    RequestThreads,
    stream_timeout_us,
    string_params,
)


def _tensor(name: str, value: Any, dtype: Any) -> Any:
    return pb_utils.Tensor(name, np.array([value], dtype=dtype))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        from trtspec.runtime.text import Tokenizer

        config = json.loads(args["model_config"])
        params = string_params(config)
        self.name = args["model_name"]
        self.llm_model = params["llm_model"]
        self.acceptance = params.get("acceptance") == LLMAPI_ACCEPTANCE_AVAILABLE
        self.tokenizer = Tokenizer(params["tokenizer_dir"], add_special_tokens=True)
        self.counter = Tokenizer(params["tokenizer_dir"], add_special_tokens=False)
        self._requests = RequestThreads()
        self._streams = BlsStreams()
        # it calls decoupled BLS from several threads: the 2.51 stub can
        # deadlock, and the watchdog learns of it from this (trtspec.runtime.heartbeat)
        heartbeat.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            self._requests.start(self._serve, request)

    def finalize(self) -> None:
        self._requests.join()
        self._streams.close()

    def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        cancel = Cancellation.of(request, sender)
        sender = PruningSender.wrap(sender, request, pb_utils.InferenceResponse)
        try:
            self._run(RequestParams.from_request(request), sender, cancel)
        except Cancelled:
            end_cancelled(sender)
        except Exception as exc:
            sender.send(
                pb_utils.InferenceResponse(error=error_reply(self.name, exc)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        finally:
            cancel.close()

    def _run(
        self,
        p: RequestParams,
        sender: Any,
        cancel: Cancellation,
        deadline: float | None = None,
    ) -> None:
        """Answer ``p`` through ``sender``; ``deadline`` (``time.monotonic()``)
        bounds the whole call where the caller has one of its own (the
        router running this model in process)."""
        start = time.perf_counter_ns()
        inputs = [
            _tensor("text_input", p.text.encode("utf-8"), np.object_),
            _tensor("streaming", True, np.bool_),
            _tensor("sampling_param_max_tokens", p.max_tokens, np.int32),
            _tensor("sampling_param_return_perf_metrics", True, np.bool_),
        ]
        if p.temperature is not None:
            inputs.append(_tensor("sampling_param_temperature", p.temperature, np.float32))
        if p.top_k is not None:
            inputs.append(_tensor("sampling_param_top_k", p.top_k, np.int32))
        if p.top_p is not None:
            inputs.append(_tensor("sampling_param_top_p", p.top_p, np.float32))
        if p.seed is not None:
            inputs.append(_tensor("sampling_param_seed", p.seed, np.uint64))
        call = pb_utils.InferenceRequest(
            model_name=self.llm_model,
            inputs=inputs,
            requested_output_names=[
                "text_output",
                "total_draft_tokens",
                "total_accepted_draft_tokens",
            ],
            timeout=stream_timeout_us(p.max_tokens),
            parameters=cancel.parameters(),
        )
        timeout_s = stream_timeout_us(p.max_tokens) / 1e6
        if deadline is not None:
            timeout_s = min(timeout_s, max(0.0, deadline - time.monotonic()))
        stream = ExecStream(
            lambda: call.exec(decoupled=True),
            timeout_s,
            self.llm_model,
            keep=self._streams.keep,
            down=watch(self.name),  # its llmapi model's stub died: ends now
        )
        from trtspec.runtime.text import CumulativeText

        text = CumulativeText()
        first_ns: int | None = None
        totals: dict[str, int] = {}
        for batch in stream.batches:
            if cancel.is_cancelled():
                cancel_stream(stream.responses)
                for _ in stream.batches:
                    pass
                raise Cancelled
            pieces = []
            for response in batch:
                if response.has_error():
                    raise callee_error(self.llm_model, response.error())
                out = {t.name(): t.as_numpy() for t in response.output_tensors()}
                for name in ("total_draft_tokens", "total_accepted_draft_tokens"):
                    if name in out and out[name].size:
                        totals[name] = int(np.asarray(out[name]).reshape(-1)[0])
                whole = out.get("text_output")
                if whole is None or not whole.size:
                    continue
                value = whole.reshape(-1)[0]
                value = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                piece = text.update(value)  # the whole text so far -> what it adds
                if piece:
                    pieces.append(piece)
            if not pieces:
                continue
            first_ns = first_ns or time.perf_counter_ns()
            if p.stream:  # what queued up meanwhile goes out as one delta
                sender.send(self._delta("".join(pieces)))
        completion = text.whole
        self._final(p, "" if p.stream else completion, completion, totals, start, first_ns, sender)

    def _delta(self, piece: str) -> Any:
        return pb_utils.InferenceResponse(
            output_tensors=[
                _tensor("text_output", piece.encode("utf-8"), np.object_),
                pb_utils.Tensor("output_ids", np.zeros(0, dtype=np.int32)),
                _tensor("is_final", False, np.bool_),
            ]
        )

    def _final(  # noqa: PLR0917 - the request's parts, in the order they are produced
        self,
        p: RequestParams,
        tail: str,
        completion: str,
        totals: dict[str, int],
        start: int,
        first_ns: int | None,
        sender: Any,
    ) -> None:
        ids = self.counter.encode(completion)
        end = time.perf_counter_ns()
        tensors = [
            _tensor("text_output", tail.encode("utf-8"), np.object_),
            pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32)),
            _tensor("is_final", True, np.bool_),
            _tensor("prompt_tokens", len(self.tokenizer.encode(p.text)), np.int32),
            _tensor("completion_tokens", len(ids), np.int32),
            _tensor("server_ttft_ns", (first_ns or end) - start, np.int64),
            _tensor("server_total_ns", end - start, np.int64),
            _tensor("variant", self.name.encode("utf-8"), np.object_),
            _tensor("fallback", False, np.bool_),
        ]
        if self.acceptance and "total_draft_tokens" in totals:
            tensors.append(_tensor("draft_tokens", totals["total_draft_tokens"], np.int32))
            tensors.append(
                _tensor("accepted_tokens", totals.get("total_accepted_draft_tokens", 0), np.int32)
            )
        sender.send(
            pb_utils.InferenceResponse(output_tensors=tensors),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
