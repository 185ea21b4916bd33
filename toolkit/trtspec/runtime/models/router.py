"""The ``router`` Python model (decoupled): the same inputs and outputs as an
orchestrator; it picks the variant for the request's ``route`` from the
routing table next to its config (``routing.json``), sends ``canary_percent``
of a route's traffic to the route's variant (deterministic from the request
id), forwards every response of that orchestrator, and — when the chosen
variant fails on the server's side before producing any output — retries
the request on the route's fallback variant and marks the final response
``fallback: true``. A client's error (a value ``trtspec.runtime.limits`` refuses, or
an ``INVALID_ARG`` from the variant) is returned as that error and never
retried: the fallback would fail the same way or, worse, hide it. A failure
after text was already streamed is returned as an error rather than retried,
because the client has already received part of the answer. A cancelled
client stream stops the chosen orchestrator (and its engine) at their next
step through ``trtspec.runtime.cancel``. The rollout (``trtspec.runtime.models.rollout_live``)
supplies the routing table of the moment, and logs, measures and watches
each request.

Every request has one deadline (``threads.stream_timeout_us`` of its
``max_tokens``), enforced here whatever the variant does
(``threads.ExecStream``): past it the client gets an error, the
variant is told to stop (the cancel flag, kept up for ``LINGER_S``) and the
route's concurrency slot is released; nothing is retried on the fallback
then, since the time is spent. A request waiting on a variant that the
watchdog marks down meanwhile ends at once (``threads.CalleeDown``): on the
fallback when nothing was streamed yet, else as that error. An
orchestrator's failure after it streamed arrives in band (the ``error``
tensor of its final response) and is answered as that error. A variant
the stub watchdog marked down (its stub died; ``trtspec.runtime.health``) is not
tried: its routes go to their fallback. With
``in_process_variants`` (what ``trtspec repo`` writes) the first try runs the
variant's generation in this process (``inprocess.py``) under the same
deadline, tracking, cancellation and fallback rules; the fallback retry goes
over BLS. With ``router.instances`` > 1 Triton runs several router processes:
they count a route's in-flight requests together (``trtspec.runtime.in_flight``),
append to one request log and label their metrics with ``router_instance``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.artifacts.repo_manifest import ROUTING_FILE
from trtspec.artifacts.routing import Choice, InFlight, choose, load_routing
from trtspec.procutil import skip_interpreter_teardown, unique_id
from trtspec.runtime import heartbeat
from trtspec.runtime.cancel import POLL_S, Cancellation, Cancelled, cancel_stream
from trtspec.runtime.contract import ORCHESTRATOR_INPUTS, ORCHESTRATOR_OUTPUTS
from trtspec.runtime.health import is_down, watch
from trtspec.runtime.in_flight import SharedInFlight, run_key
from trtspec.runtime.limits import check_sampling, decode_text
from trtspec.runtime.models.inprocess import InProcessVariants
from trtspec.runtime.models.protocol import (
    callee_error,
    end_cancelled,
    error_reply,
    is_client_error,
    wants_text,
)
from trtspec.runtime.models.rollout_live import Live, Tracked
from trtspec.runtime.threads import (
    BlsStreams,
    DeadlineExceeded,
    ExecStream,
    PruningSender,
    RequestThreads,
    stream_timeout_us,
    string_params,
)

INPUT_NAMES = [t.name for t in ORCHESTRATOR_INPUTS]
_INPUTS = frozenset(INPUT_NAMES)
OUTPUT_NAMES = [t.name for t in ORCHESTRATOR_OUTPUTS]
# How long the cancel flag of a request past its deadline stays up: the
# variant sees it at its next step, which may come long after the answer.
LINGER_S = 120.0


class _Progress(Tracked):
    """The rollout's view of one request plus its deadline."""

    def __init__(self, deadline: float) -> None:
        super().__init__()
        self.deadline = deadline  # time.monotonic() by which the request must end
        self.expired = False
        self.wants_text = True  # protocol.wants_text of the client's request


class _InBandError:
    """An orchestrator's failure sent as the ``error`` tensor of its final
    response, shaped like the ``TritonError`` that ``callee_error`` reads."""

    def __init__(self, message: str) -> None:
        self._message = message

    def message(self) -> str:
        return self._message


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


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


def instance_names(config: dict[str, Any]) -> list[str]:
    """The names Triton gives the instances of a model whose config (as the
    stub's ``args["model_config"]`` JSON) is ``config``: ``<group>_<i>`` for
    each ``instance_group`` (its ``name``, else ``<model>_<index>``)."""
    names = []
    for index, group in enumerate(config.get("instance_group") or [{}]):
        name = group.get("name") or f"{config.get('name', 'router')}_{index}"
        names += [f"{name}_{i}" for i in range(int(group.get("count", 1) or 1))]
    return names


def server_side(exc: BaseException) -> bool:
    """Whether a variant's failure is the server's (worth the fallback) rather
    than the client's bad input or cancel (which the fallback cannot fix)."""
    return not isinstance(exc, Cancelled) and not is_client_error(exc)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = string_params(config)
        routing_file = params.get("routing_file") or ROUTING_FILE
        self.table = load_routing(Path(args["model_repository"]) / routing_file)
        # Several router processes (instance_group count > 1, spec
        # `router.instances`) share one server's limits: the in-flight counts
        # live in a file (trtspec.runtime.in_flight), the request log takes
        # lines from all of them, each metric carries its process's label.
        slots = instance_names(config)
        instance = args.get("model_instance_name") or ""
        shared = len(slots) > 1
        self.live = Live(
            Path(args["model_repository"]),
            Path(args["model_repository"]) / routing_file,
            self.table,
            pb_utils,
            instance=instance if shared else None,
        )
        self.variants = {v for v in params.get("variants", "").split(",") if v}
        self._requests = RequestThreads()
        self._streams = BlsStreams()
        self._in_flight = InFlight()
        if shared:
            try:
                self.live.scratch.mkdir(parents=True, exist_ok=True)
                self._in_flight = SharedInFlight(
                    self.live.scratch, instance, key=run_key(os.getppid())
                )
                pb_utils.Logger.log_info(
                    f"router: instance {instance} of {len(slots)}; in-flight counts shared "
                    f"in {self.live.scratch}"
                )
            except OSError as exc:  # each process then limits its own share
                pb_utils.Logger.log_warn(
                    f"router: instance {instance} of {len(slots)}: cannot share in-flight "
                    f"counts in {self.live.scratch} ({exc}); max_concurrency and draft-length "
                    "schedules count this process's requests only"
                )
        # in_process_variants: the first try runs in this process (inprocess.py)
        self._inprocess = (
            InProcessVariants(Path(args["model_repository"]).parent)
            if InProcessVariants.enabled(params)
            else None
        )
        if self._inprocess is not None:  # now, not at each variant's first request
            loaded = self._inprocess.preload(self.variants, pb_utils.Logger.log_warn)
            pb_utils.Logger.log_info(f"router: variants run in process: {', '.join(loaded)}")
        # it calls decoupled BLS from several threads: the 2.51 stub can
        # deadlock, and the watchdog learns of it from this (trtspec.runtime.heartbeat;
        # started last, once everything is loaded)
        heartbeat.start()

    def execute(self, requests: list) -> None:
        for request in requests:
            self._requests.start(self._serve, request)

    def _serve(self, request: Any) -> None:
        sender = request.get_response_sender()
        # The head of every chain: it mints the request's cancellation token
        # and never takes one from its client, who could otherwise share a
        # token (and so a cancel) with another request.
        cancel = Cancellation(sender, poll_s=POLL_S)
        sender = PruningSender.wrap(sender, request, pb_utils.InferenceResponse)
        progress = _Progress(time.monotonic() + stream_timeout_us(None) / 1e6)
        progress.wants_text = wants_text(request)
        error: str | None = None
        try:
            # inputs() once (get_input_tensor_by_name builds the list per name)
            inputs: dict[str, np.ndarray] = {
                t.name(): t.as_numpy() for t in request.inputs() if t.name() in _INPUTS
            }
            check_inputs(inputs)
            progress.deadline = (
                time.monotonic() + stream_timeout_us(_value(inputs, "max_tokens")) / 1e6
            )
            route = (
                decode_text("route", inputs["route"].reshape(-1)[0]) if "route" in inputs else None
            )
            if "request_id" in inputs:
                request_id = decode_text("request_id", inputs["request_id"].reshape(-1)[0])
            else:
                request_id = request.request_id() or unique_id()
            table = self.live.table()  # this request keeps it to its end
            picked = choose(table, route, request_id)
            down = picked.variant != picked.fallback_variant and is_down(picked.variant)
            if down:  # its stub died (trtspec.runtime.health): straight to the fallback
                picked = Choice(picked.fallback_variant, picked.fallback_variant, None, False)
            # over the route's max_concurrency the request goes to the fallback
            choice = self._in_flight.admit(table, route, picked)
            self.live.begin(
                progress,
                table=table,
                route=route,
                request_id=request_id,
                choice=choice,
                inputs=inputs,
            )
            if choice.num_draft_tokens is not None and "num_draft_tokens" not in inputs:
                inputs["num_draft_tokens"] = np.array([choice.num_draft_tokens], dtype=np.int32)
            held = True  # the route's in-flight place (released once)
            try:
                self._forward(choice.variant, inputs, sender, progress, cancel, fallback=down)
            except Exception as exc:
                if (
                    progress.sent
                    or choice.variant == choice.fallback_variant
                    or not server_side(exc)
                    or isinstance(exc, DeadlineExceeded)
                ):
                    raise
                pb_utils.Logger.log_warn(
                    f"router: variant {choice.variant!r} failed for route {route!r} "
                    f"({exc}); retrying on {choice.fallback_variant!r}"
                )
                # the retry runs on the fallback: it no longer holds a place
                # of the variant's (a failing variant would starve its route)
                held = False
                self._in_flight.release(table, route, choice)
                inputs.pop("num_draft_tokens", None)
                self._forward(
                    choice.fallback_variant, inputs, sender, progress, cancel, fallback=True
                )
            finally:
                if held:
                    self._in_flight.release(table, route, choice)
        except Cancelled:
            error = "cancelled"
            pb_utils.Logger.log_info("router: request cancelled")
            end_cancelled(sender)
        except Exception as exc:
            error = str(exc) or type(exc).__name__
            sender.send(
                pb_utils.InferenceResponse(error=error_reply("router", exc)),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
        finally:
            if progress.expired:
                # Keep the flag up until the variant has seen it.
                timer = threading.Timer(LINGER_S, cancel.close)
                timer.daemon = True
                timer.start()
            else:
                cancel.close()
            self.live.end(progress, error)

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
        if self._inprocess is not None and not fallback and self._inprocess.accepts(variant):
            try:
                self._inprocess.run(variant, inputs, sender, progress, cancel)
            except DeadlineExceeded:
                progress.expired = True
                cancel.raise_flag()  # its engines stop at their next step
                raise
            return
        left_s = max(0.0, progress.deadline - time.monotonic())
        request = pb_utils.InferenceRequest(
            model_name=variant,
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs.items()],
            requested_output_names=OUTPUT_NAMES,
            timeout=max(1, int(left_s * 1_000_000)),
            parameters=cancel.parameters(),
        )
        # exec() (which on 2.51 returns with the first response) and the pump
        # of its responses on one worker thread (threads.ExecStream)
        call = ExecStream(
            lambda: request.exec(decoupled=True),
            left_s,
            variant,
            keep=self._streams.keep,  # see BlsStreams: not freed by the stub's C++ thread
            down=watch(variant),  # its stub died: ends now (CalleeDown), not at the deadline
        )
        try:
            self._relay(variant, call, sender, progress, cancel, fallback=fallback)
        except DeadlineExceeded:
            progress.expired = True
            cancel.raise_flag()  # the variant (and its engines) stop at their next step
            if call.responses is not None:
                cancel_stream(call.responses)
            raise

    def _relay(
        self,
        variant: str,
        call: ExecStream,
        sender: Any,
        progress: _Progress,
        cancel: Cancellation,
        *,
        fallback: bool,
    ) -> None:
        final_sent = False
        stream = (response for batch in call.batches for response in batch)
        for response in stream:
            if cancel.is_cancelled():
                # The orchestrator stops at its next step (it sees the flag);
                # wait for its last answer so nothing of this request outlives it.
                cancel_stream(call.responses)
                for _ in stream:
                    pass
                raise Cancelled
            if response.has_error():
                raise callee_error(variant, response.error(), name_it=False)
            tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
            if "error" in tensors:
                message = _text(tensors["error"].reshape(-1)[0])
                raise callee_error(variant, _InBandError(message), name_it=False)
            if not tensors:
                continue
            is_final = bool(tensors.get("is_final", np.array([False])).reshape(-1)[0])
            if is_final:
                tensors["variant"] = np.array([variant.encode("utf-8")], dtype=np.object_)
                tensors["fallback"] = np.array([fallback], dtype=np.bool_)
            progress.track(tensors, is_final)
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
        self.live.close()
        if isinstance(self._in_flight, SharedInFlight):
            self._in_flight.close()
        if self._inprocess is not None:
            self._inprocess.close()
        skip_interpreter_teardown()  # the stub's exit counts in the server's stop time
