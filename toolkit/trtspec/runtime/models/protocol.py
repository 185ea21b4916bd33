"""What a request to trtspec's text-level models (the router, an
orchestrator, the LLM-API adapter) carries and how their errors are
answered: ``RequestParams`` (the §5 inputs, read and checked once),
``CalleeError`` / ``callee_error`` (a BLS callee's error, the client's or the
server's), ``error_reply`` (the error a model answers with) and
``end_cancelled`` (the empty final response of a cancelled request). Shared
by the router, the in-process runner and the adapter, which used to import
them from the orchestrator model. Loaded inside a Triton stub only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.runtime.limits import (
    CLIENT_ERROR,
    ParamError,
    check,
    check_sampling,
    decode_text,
    draft_tokens_request_problem,
)

_LENGTH = struct.Struct("<I")


def fast_byte_tensors(utils: Any) -> bool:
    """Give ``utils`` (the stub's ``triton_python_backend_utils``) a
    ``serialize_byte_tensor`` that answers a one-element tensor of ``bytes``
    (every ``text_output`` of a streamed response) without NumPy's iterator:
    the 4-byte little-endian length and the bytes, what the original answers
    (``tests/unit/test_fast_byte_tensors.py`` holds the two to the same
    output); anything else goes to the original. 2.51's ``pb_utils.Tensor``
    looks the function up on the module for each BYTES tensor it makes, so a
    router or orchestrator makes one per streamed response (~0.03 ms of the
    stub's CPU a token at 4 in flight on two cores, §6 tenth round). Returns
    whether it was installed (not where ``utils`` lacks the function, or
    already has this one)."""
    original = getattr(utils, "serialize_byte_tensor", None)
    if original is None or getattr(original, "trtspec_fast", False):
        return False
    pack = _LENGTH.pack

    def serialize_byte_tensor(tensor: Any) -> Any:
        if tensor.dtype == np.object_ and tensor.size == 1:
            value = tensor.reshape(-1)[0]
            if type(value) is bytes:
                return pack(len(value)) + value
        return original(tensor)

    serialize_byte_tensor.trtspec_fast = True  # type: ignore[attr-defined]
    utils.serialize_byte_tensor = serialize_byte_tensor
    return True


fast_byte_tensors(pb_utils)


class CalleeError(RuntimeError):
    """A BLS callee answered with an error: its message, whether it is the
    client's error (an ``INVALID_ARG`` code, or the callee's mark), and
    whether the message already carries the mark."""

    def __init__(self, message: str, *, client: bool, marked: bool) -> None:
        super().__init__(message)
        self.client = client
        self.marked = marked


def callee_error(model_name: str, error: Any, *, name_it: bool = True) -> CalleeError:
    """``error`` of a call to ``model_name``; ``name_it=False`` when the callee
    names itself first (our orchestrators do)."""
    message = error.message()
    marked = message.startswith(f"{model_name}: {CLIENT_ERROR}: ")
    code = error.code() if callable(getattr(error, "code", None)) else None
    # An engine model marks its refusals (prompt too long, no prompt tokens)
    # with a bare prefix: the code does not survive a 2.51 BLS call.
    bare = message.startswith(f"{CLIENT_ERROR}: ")
    if bare:
        message = message[len(CLIENT_ERROR) + 2 :]
    client = marked or bare or code == pb_utils.TritonError.INVALID_ARG
    return CalleeError(
        f"{model_name}: {message}" if name_it else message, client=client, marked=marked
    )


def wants_text(request: Any) -> bool:
    """Whether the client asked for ``text_output`` (a client that names no
    outputs gets them all). One that did not, a client of token ids, gets its
    streamed responses without text: the text is then decoded once, for the
    final response, rather than for every token."""
    names = request.requested_output_names()
    return not names or "text_output" in names


def is_client_error(exc: BaseException) -> bool:
    return isinstance(exc, ParamError) or (isinstance(exc, CalleeError) and exc.client)


def error_reply(who: str, exc: BaseException) -> Any:
    """The error to answer ``exc`` with: a client's error is ``INVALID_ARG``
    and marked; everything else is a server-side ``INTERNAL``."""
    if not is_client_error(exc):
        return pb_utils.TritonError(f"{who}: {exc}")
    marked = isinstance(exc, CalleeError) and exc.marked
    message = f"{who}: {exc}" if marked else f"{who}: {CLIENT_ERROR}: {exc}"
    return pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)


def end_cancelled(sender: Any) -> None:
    """End a cancelled request with an empty final response. Not an error: on
    2.51 an error response after streamed ones never reaches a BLS caller,
    whose response iterator then waits forever."""
    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def _scalar(inputs: dict[str, np.ndarray], name: str) -> Any:
    array = inputs.get(name)
    if array is None:
        return None
    array = array.reshape(-1)
    return array[0] if array.size else None


@dataclass
class RequestParams:
    text: str
    max_tokens: int
    temperature: float | None
    top_k: int | None
    top_p: float | None
    seed: int | None
    stream: bool
    num_draft_tokens: int | None

    @classmethod
    def from_request(cls, request: Any) -> RequestParams:
        """The parameters of a Triton request (its ``inputs()`` read once)."""
        return cls.from_inputs({t.name(): t.as_numpy() for t in request.inputs()})

    @classmethod
    def from_inputs(cls, inputs: dict[str, np.ndarray]) -> RequestParams:
        """The parameters of a request whose input tensors are ``inputs``
        (name → array); raises ``ParamError`` on a bad value."""
        text = _scalar(inputs, "text_input")
        max_tokens = _scalar(inputs, "max_tokens")
        if text is None or max_tokens is None:
            raise ParamError("text_input and max_tokens are required")

        def opt(name: str, kind: type) -> Any:
            value = _scalar(inputs, name)
            return None if value is None else kind(value)

        params = cls(
            text=decode_text("text_input", text),
            max_tokens=int(max_tokens),
            temperature=opt("temperature", float),
            top_k=opt("top_k", int),
            top_p=opt("top_p", float),
            seed=opt("seed", int),
            stream=bool(opt("stream", bool) or False),
            num_draft_tokens=opt("num_draft_tokens", int),
        )
        if params.num_draft_tokens is not None:  # ignored by non-drafting modes, never wrong
            check("num_draft_tokens", params.num_draft_tokens, draft_tokens_request_problem)
        check_sampling(
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            seed=params.seed,
        )
        return params
