"""The ``router`` Python model (decoupled): the same inputs and outputs as an
orchestrator; it picks the variant for the request's ``route`` from the
routing table next to its config (``routing.json``), sends ``canary_percent``
of a route's traffic to the route's variant (deterministic from the request
id), forwards every response of that orchestrator, and — when the chosen
variant fails on the server's side before producing any output — retries
the request on the route's fallback variant and marks the final response
``fallback: true``. A client's error (a value ``trtspec.limits`` refuses, or
an ``INVALID_ARG`` from the variant) is returned as that error and never
retried: the fallback would fail the same way or, worse, hide it. A failure
after text was already streamed is returned as an error rather than retried,
because the client has already received part of the answer. A cancelled
client stream stops the chosen orchestrator (and its engine) at their next
step through ``trtspec.cancel``. A variant the stub watchdog marked down (its
stub died; ``trtspec.health``) is not tried: its routes go to their fallback.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.cancel import Cancellation, Cancelled, cancel_stream
from trtspec.health import is_down
from trtspec.limits import check_sampling, decode_text
from trtspec.repo.contract import ORCHESTRATOR_INPUTS, ORCHESTRATOR_OUTPUTS
from trtspec.repo.models.orchestrator import (
    callee_error,
    end_cancelled,
    error_reply,
    is_client_error,
)
from trtspec.repo.models.threads import (
    BlsStreams,
    RequestThreads,
    stream_timeout_us,
    string_params,
)
from trtspec.repo.routing import Choice, InFlight, choose, load_routing

INPUT_NAMES = [t.name for t in ORCHESTRATOR_INPUTS]
OUTPUT_NAMES = [t.name for t in ORCHESTRATOR_OUTPUTS]


class _Progress:
    def __init__(self) -> None:
        self.sent = 0


def _value(inputs: dict[str, np.ndarray], name: str) -> Any:
    array = inputs.get(name)
    if array is None or not array.size:
        return None
    return array.reshape(-1)[0].item()


def check_inputs(inputs: dict[str, np.ndarray]) -> None:
    """Refuse bad values before any variant runs (``ParamError``)."""
    check_sampling(
        max_tokens=_value(inputs, "max_tokens"),
        temperature=_value(inputs, "temperature"),
        top_p=_value(inputs, "top_p"),
        top_k=_value(inputs, "top_k"),
        seed=_value(inputs, "seed"),
    )


def server_side(exc: BaseException) -> bool:
    """Whether a variant's failure is the server's (worth the fallback) rather
    than the client's bad input or cancel (which the fallback cannot fix)."""
    return not isinstance(exc, Cancelled) and not is_client_error(exc)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = string_params(config)
        routing_file = params.get("routing_file") or "routing.json"
        self.table = load_routing(Path(args["model_repository"]) / routing_file)
        self.variants = {v for v in params.get("variants", "").split(",") if v}
        self._requests = RequestThreads()
        self._streams = BlsStreams()
        self._in_flight = InFlight()

    def execute(self, requests: list) -> None:
        for request in requests:
            self._requests.start(self._serve, request)

    def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        cancel = Cancellation.of(request, sender)
        progress = _Progress()
        try:
            inputs: dict[str, np.ndarray] = {}
            for name in INPUT_NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    inputs[name] = tensor.as_numpy()
            check_inputs(inputs)
            route = (
                decode_text("route", inputs["route"].reshape(-1)[0]) if "route" in inputs else None
            )
            if "request_id" in inputs:
                request_id = decode_text("request_id", inputs["request_id"].reshape(-1)[0])
            else:
                request_id = request.request_id() or uuid.uuid4().hex
            picked = choose(self.table, route, request_id)
            down = picked.variant != picked.fallback_variant and is_down(picked.variant)
            if down:  # its stub died (trtspec.health): straight to the fallback
                picked = Choice(picked.fallback_variant, picked.fallback_variant, None, False)
            # over the route's max_concurrency the request goes to the fallback
            choice = self._in_flight.admit(self.table, route, picked)
            if choice.num_draft_tokens is not None and "num_draft_tokens" not in inputs:
                inputs["num_draft_tokens"] = np.array([choice.num_draft_tokens], dtype=np.int32)
            try:
                self._forward(choice.variant, inputs, sender, progress, cancel, fallback=down)
            except Exception as exc:
                if (
                    progress.sent
                    or choice.variant == choice.fallback_variant
                    or not server_side(exc)
                ):
                    raise
                pb_utils.Logger.log_warn(
                    f"router: variant {choice.variant!r} failed for route {route!r} "
                    f"({exc}); retrying on {choice.fallback_variant!r}"
                )
                inputs.pop("num_draft_tokens", None)
                self._forward(
                    choice.fallback_variant, inputs, sender, progress, cancel, fallback=True
                )
            finally:
                self._in_flight.release(self.table, route, choice)
        except Cancelled:
            pb_utils.Logger.log_info("router: request cancelled")
            end_cancelled(sender)
        except Exception as exc:
            sender.send(
                pb_utils.InferenceResponse(error=error_reply("router", exc)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        finally:
            cancel.close()

    def _forward(
        self,
        variant: str,
        inputs: dict[str, np.ndarray],
        sender: Any,
        progress: _Progress,
        cancel: Cancellation,
        *,
        fallback: bool,
    ) -> None:
        max_tokens = inputs.get("max_tokens")
        request = pb_utils.InferenceRequest(
            model_name=variant,
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=OUTPUT_NAMES,
            timeout=stream_timeout_us(
                int(max_tokens.reshape(-1)[0]) if max_tokens is not None else None
            ),
            parameters=cancel.parameters(),
        )
        responses = request.exec(decoupled=True)
        try:
            self._relay(variant, responses, sender, progress, cancel, fallback=fallback)
        finally:
            self._streams.keep(responses)  # see BlsStreams: not freed by the stub's C++ thread

    def _relay(
        self,
        variant: str,
        responses: Any,
        sender: Any,
        progress: _Progress,
        cancel: Cancellation,
        *,
        fallback: bool,
    ) -> None:
        final_sent = False
        for response in responses:
            if cancel.is_cancelled():
                # The orchestrator stops at its next step (it sees the flag);
                # wait for its last answer so nothing of this request outlives it.
                cancel_stream(responses)
                for _ in responses:
                    pass
                raise Cancelled
            if response.has_error():
                raise callee_error(variant, response.error(), name_it=False)
            tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if not tensors:
                continue
            is_final = bool(tensors.get("is_final", np.array([False])).reshape(-1)[0])
            if is_final:
                tensors["variant"] = np.array([variant.encode("utf-8")], dtype=np.object_)
                tensors["fallback"] = np.array([fallback], dtype=np.bool_)
            out = [pb_utils.Tensor(name, array) for name, array in tensors.items()]
            flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if is_final else 0
            sender.send(pb_utils.InferenceResponse(output_tensors=out), flags=flags)
            progress.sent += 1
            final_sent = final_sent or is_final
        if not final_sent:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self) -> None:
        self._requests.join()
        self._streams.close()
