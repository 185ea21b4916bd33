"""The router's in-process variant runner (``trtspec.runtime.models.inprocess``)
with the orchestrator's real ``_Generation`` and a stand-in
``triton_python_backend_utils`` whose engine streams what each test says.

What the served tests (tests/integration/test_repo_served.py,
test_requests_served.py) cannot reach cheaply: the request's one deadline
ends a stalled engine stream in the variant's name, within the deadline and
without a fallback; and the relay's bookkeeping in detail — every response
counted, the rollout handed the first response with tokens and the final one
(never the others), a cancel raised between steps, a client's error kept the
client's, engine responses that queued up while the last ones were answered
sent as one response, and a model that is not the orchestrator left to BLS;
the LLM-API flow's adapter run the same way, straight against its llmapi model.
"""

from __future__ import annotations

import importlib
import json
import sys
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

FINAL = 1
# engine model name -> what its stream yields for one request: token lists
# (one response each), "stall" (never answers again) or an error message
Script = list[Any]


class Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name, self._array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


class TritonError:
    INVALID_ARG, INTERNAL = 3, 13

    def __init__(self, message: str, code: int = 13) -> None:
        self._message, self._code = message, code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class Response:
    def __init__(self, output_tensors: list[Tensor] | None = None, error: Any = None) -> None:
        self._tensors, self._error = list(output_tensors or []), error

    def output_tensors(self) -> list[Tensor]:
        return self._tensors

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> Any:
        return self._error


class Engine:
    """The engine models' side: each streamed request plays ``script``."""

    def __init__(self) -> None:
        self.script: Script = []
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()  # ends a "stall"
        self.step_s = 0.0  # time between two responses

    def stream(self, inputs: dict[str, np.ndarray]) -> Iterator[Response]:
        self.requests.append(inputs)
        for step in self.script:
            if step == "stall":
                self.release.wait(30)
                return
            if isinstance(step, str):
                yield Response(error=TritonError(step, TritonError.INVALID_ARG))
                return
            if self.step_s:
                time.sleep(self.step_s)
            ids = np.asarray(step, dtype=np.int32)
            yield Response(
                [
                    Tensor("output_ids", ids.reshape(1, 1, -1)),
                    Tensor("sequence_length", np.array([[len(step)]], dtype=np.int32)),
                ]
            )

    def text_stream(self, inputs: dict[str, np.ndarray]) -> Iterator[Response]:
        """The llmapi model's side: each token list of ``script`` is one
        iteration, whose response carries the whole text so far (token ``i``
        is the letter ``chr(96 + i)``, 0 no text), as upstream's
        ``_create_response`` sends ``CompletionOutput.text``
        (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py at 044a90d2
        and b35ac1b6); the last response repeats the whole answer."""
        whole = ""
        for response in self.stream(inputs):
            if response.has_error():
                yield response
                continue
            ids = response.output_tensors()[0].as_numpy().reshape(-1).tolist()
            whole += "".join(chr(96 + i) for i in ids if i)
            yield Response([Tensor("text_output", np.array([whole.encode()], dtype=np.object_))])
        if whole and ENGINE.script and not isinstance(ENGINE.script[-1], str):
            yield Response([Tensor("text_output", np.array([whole.encode()], dtype=np.object_))])


ENGINE = Engine()


class InferenceRequest:
    def __init__(self, model_name: str, inputs: list[Tensor], **_: Any) -> None:
        self.model_name = model_name
        self.inputs = {t.name(): t.as_numpy() for t in inputs}

    def exec(self, decoupled: bool = False) -> Any:
        if self.model_name == "ad__llmapi":  # the llmapi contract: text deltas
            return ENGINE.text_stream(self.inputs)
        assert decoupled and self.model_name == "target", self.model_name
        return ENGINE.stream(self.inputs)


class Logger:
    lines: ClassVar[list[str]] = []

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.lines.append(message)

    log_warn = log_info


def _get(container: Any, name: str) -> Tensor | None:
    tensors = container.inputs() if hasattr(container, "inputs") else container.output_tensors()
    return next((t for t in tensors if t.name() == name), None)


def _fake_pb_utils() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = Tensor  # type: ignore[attr-defined]
    pb.TritonError = TritonError  # type: ignore[attr-defined]
    pb.InferenceResponse = Response  # type: ignore[attr-defined]
    pb.InferenceRequest = InferenceRequest  # type: ignore[attr-defined]
    pb.Logger = Logger  # type: ignore[attr-defined]
    pb.TritonModelException = RuntimeError  # type: ignore[attr-defined]
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL  # type: ignore[attr-defined]
    pb.get_input_tensor_by_name = _get  # type: ignore[attr-defined]
    pb.get_output_tensor_by_name = _get  # type: ignore[attr-defined]
    return pb


class Text:
    """Stands in for ``LocalText``: token ``i`` is the letter ``chr(97 + i)``."""

    end_id, pad_id = 0, 0

    def encode(self, text: str) -> list[int]:
        return [ord(c) - 96 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(96 + i) for i in ids if i)


class Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[dict[str, Any], int]] = []

    def send(self, response: Response | None = None, flags: int = 0) -> None:
        tensors = {} if response is None else {t.name(): t.as_numpy() for t in response._tensors}
        self.sent.append((tensors, flags))

    def is_cancelled(self) -> bool:
        return False


class Progress:
    """The router's ``_Progress``: ``sent``, ``first_ns``, ``deadline`` and
    ``track`` (recording what it was handed)."""

    def __init__(self, deadline_s: float) -> None:
        self.sent = 0
        self.first_ns: int | None = None
        self.deadline = time.monotonic() + deadline_s
        self.wants_text = True
        self.tracked: list[tuple[dict[str, Any], bool]] = []

    def track(self, tensors: dict[str, Any], is_final: bool) -> None:
        self.tracked.append((tensors, is_final))
        if self.first_ns is None and tensors.get("output_ids", np.array([])).size:
            self.first_ns = time.monotonic_ns()


class Cancel:
    def __init__(self) -> None:
        self.cancelled = False

    def is_cancelled(self) -> bool:
        return self.cancelled

    def parameters(self) -> dict[str, str]:
        return {}


@pytest.fixture
def inprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``InProcessVariants`` over a repository holding the orchestrator
    ``baseline`` (mode none, engine ``target``) and an echo model ``echo``,
    imported with the stand-in pb_utils; restored afterwards."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    names = [
        "trtspec.runtime.models.protocol",
        "trtspec.runtime.models.orchestrator",
        "trtspec.runtime.models.inprocess",
        "trtspec.runtime.models.llmapi_adapter",
    ]
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    # `from trtspec.runtime.models import x` reads the package's attribute first:
    # drop those too, or a fresh module would meet a stale sibling
    package = importlib.import_module("trtspec.runtime.models")
    attrs = {n: package.__dict__.pop(n.rpartition(".")[2], None) for n in names}
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", _fake_pb_utils())
    config = mc.ModelConfig(name="baseline", backend="python")
    params = {
        "variant": "baseline",
        "mode": "none",
        "preprocessing_model": "preprocessing",
        "postprocessing_model": "postprocessing",
        "target_model": "target",
        "perf_metrics": "false",
    }
    for key, value in params.items():
        config.parameters[key].string_value = value
    (tmp_path / "baseline" / "1").mkdir(parents=True)
    (tmp_path / "baseline" / "config.pbtxt").write_text(text_format.MessageToString(config))
    (tmp_path / "baseline" / "1" / "model.py").write_text(
        "from trtspec.runtime.models.orchestrator import TritonPythonModel\n"
    )
    # the LLM-API flow's adapter "ad" in front of its llmapi model "ad__llmapi"
    adapter = mc.ModelConfig(name="ad", backend="python")
    for key, value in {"llm_model": "ad__llmapi", "tokenizer_dir": str(tmp_path)}.items():
        adapter.parameters[key].string_value = value
    (tmp_path / "ad" / "1").mkdir(parents=True)
    (tmp_path / "ad" / "config.pbtxt").write_text(text_format.MessageToString(adapter))
    (tmp_path / "ad" / "1" / "model.py").write_text(
        "from trtspec.runtime.models.llmapi_adapter import TritonPythonModel\n"
    )
    from trtspec.runtime import text as text_module

    monkeypatch.setattr(text_module, "Tokenizer", lambda folder, **_: Text())
    (tmp_path / "echo" / "1").mkdir(parents=True)
    (tmp_path / "echo" / "1" / "model.py").write_text(
        "from trtspec.bench.echo_model import TritonPythonModel\n"
    )
    ENGINE.__init__()  # type: ignore[misc]
    Logger.lines = []
    try:
        module = importlib.import_module("trtspec.runtime.models.inprocess")
        variants = module.InProcessVariants(tmp_path)
        variants.model("baseline").text = Text()
        yield variants
    finally:
        ENGINE.release.set()
        for n in names:
            sys.modules.pop(n, None)
            package.__dict__.pop(n.rpartition(".")[2], None)
        sys.modules.update(saved)
        for n, module in attrs.items():
            if module is not None:
                setattr(package, n.rpartition(".")[2], module)


def _request(text: str = "abc", max_tokens: int = 8) -> dict[str, np.ndarray]:
    return {
        "text_input": np.array([text.encode()], dtype=np.object_),
        "max_tokens": np.array([max_tokens], dtype=np.int32),
        "stream": np.array([True]),
    }


def run(inprocess: Any, *, deadline_s: float = 30.0, cancel: Cancel | None = None, **kw: Any):
    sender, progress = Sender(), Progress(deadline_s)
    inprocess.run("baseline", _request(**kw), sender, progress, cancel or Cancel())
    return sender, progress


def test_only_trtspecs_orchestrator_runs_in_process(inprocess: Any) -> None:
    assert inprocess.accepts("baseline")
    assert not inprocess.accepts("echo")  # another model: over BLS
    assert not inprocess.accepts("missing")


def test_every_response_is_counted_and_the_rollout_sees_the_first_and_the_final(
    inprocess: Any,
) -> None:
    ENGINE.script = [[4], [5], [6]]
    sender, progress = run(inprocess, max_tokens=3)
    texts = [t["text_output"][0].decode() for t, _ in sender.sent]
    assert "".join(texts) == "def"
    assert progress.sent == len(sender.sent) >= 2
    assert [flags for _, flags in sender.sent][-1] == FINAL
    # handed: the first response (it carries tokens) and the final one only
    assert [final for _, final in progress.tracked] == [False, True]
    first, final = progress.tracked[0][0], progress.tracked[-1][0]
    sent_ids = [i for t, _ in sender.sent for i in t["output_ids"].tolist()]
    assert sent_ids == [4, 5, 6]
    assert first["output_ids"].tolist() == sender.sent[0][0]["output_ids"].tolist() != []
    assert final["variant"][0] == b"baseline" and not final["fallback"][0]
    assert int(final["completion_tokens"][0]) == 3
    assert progress.first_ns is not None
    # the engine was asked exactly as the orchestrator model would ask it
    asked = ENGINE.requests[0]
    assert asked["input_ids"].tolist() == [[1, 2, 3]]
    assert int(asked["request_output_len"][0][0]) == 3


def test_a_stalled_engine_ends_at_the_requests_deadline_in_the_variants_name(
    inprocess: Any,
) -> None:
    from trtspec.runtime.threads import DeadlineExceeded

    ENGINE.script = [[4], "stall"]
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        run(inprocess, deadline_s=0.5)
    waited = time.monotonic() - started
    assert 0.4 <= waited < 5, waited
    assert str(info.value).startswith("baseline: no answer within its deadline of 0.")
    assert str(info.value).endswith(" s; the request was stopped")


def test_the_deadline_bounds_the_whole_request_not_each_call(inprocess: Any) -> None:
    """A request whose deadline has already passed asks the engine nothing
    more: the call gets no time of its own."""
    from trtspec.runtime.threads import DeadlineExceeded

    ENGINE.script = ["stall"]
    with pytest.raises(DeadlineExceeded):
        run(inprocess, deadline_s=0.0)


def test_a_cancel_stops_the_generation_between_steps(inprocess: Any) -> None:
    from trtspec.runtime.cancel import Cancelled

    cancel = Cancel()
    cancel.cancelled = True
    ENGINE.script = [[4], [5], [6]]
    with pytest.raises(Cancelled):
        run(inprocess, cancel=cancel)
    assert Logger.lines == ["baseline: request cancelled after 0 of 8 tokens (0 rounds)"]


def test_an_engine_refusal_is_the_clients_error_named_for_the_variant(inprocess: Any) -> None:
    from trtspec.runtime.models.protocol import CalleeError

    ENGINE.script = ["invalid request: Prompt length (3) exceeds maximum input length (2)."]
    with pytest.raises(CalleeError) as info:
        run(inprocess)
    assert info.value.client
    assert str(info.value).startswith("baseline: invalid request: target: ")


def test_a_bad_value_is_the_clients_error_before_any_engine_call(inprocess: Any) -> None:
    from trtspec.runtime.models.protocol import CalleeError

    with pytest.raises(CalleeError) as info:
        run(inprocess, max_tokens=0)
    assert info.value.client and ENGINE.requests == []
    assert "max_tokens must be an integer in [1, 2147483647], got 0" in str(info.value)


def test_responses_that_queued_up_go_out_as_one(inprocess: Any, monkeypatch) -> None:
    """Engine responses that arrived while the last one was being answered
    are answered together: fewer, fuller responses under load, same text."""
    from trtspec.runtime.models import orchestrator

    ENGINE.script = [[4], [5], [6], [7]]
    real = orchestrator.ExecStream
    ready = threading.Event()

    def slow_start(*args: Any, **kw: Any) -> Any:
        call = real(*args, **kw)
        time.sleep(0.3)  # everything arrives before the first is read
        ready.set()
        return call

    monkeypatch.setattr(orchestrator, "ExecStream", slow_start)
    sender, progress = run(inprocess, max_tokens=4)
    assert ready.is_set()
    tokens = [t["output_ids"].tolist() for t, _ in sender.sent]
    assert tokens == [[4, 5, 6, 7], []]  # one response with all four, then the final
    assert json.dumps([t["text_output"][0].decode() for t, _ in sender.sent]) == '["defg", ""]'
    final = progress.tracked[-1][0]
    assert int(final["rounds"][0]) == 4  # still one round per engine response


def test_stream_interval_sends_the_first_tokens_at_once_then_every_nth(
    inprocess: Any,
) -> None:
    """``stream_interval`` 3: the first token goes out alone (time to first
    token unchanged), then a response per three tokens, and the final one
    carries the rest; same ids, same text, fewer responses."""
    ENGINE.script = [[4], [5], [6], [7], [8], [9], [10], [11]]
    ENGINE.step_s = 0.02  # one engine response per batch
    inprocess.model("baseline").stream_interval = 3
    sender, progress = run(inprocess, max_tokens=8)
    tokens = [t["output_ids"].tolist() for t, _ in sender.sent]
    texts = [t["text_output"][0].decode() for t, _ in sender.sent]
    assert tokens == [[4], [5, 6, 7], [8, 9, 10], [11]]
    assert texts == ["d", "efg", "hij", "k"]
    assert [flags for _, flags in sender.sent] == [0, 0, 0, FINAL]
    final = progress.tracked[-1][0]
    assert int(final["completion_tokens"][0]) == 8 and int(final["rounds"][0]) == 8
    # the rollout's time to first token is the first token's
    assert progress.tracked[0][0]["output_ids"].tolist() == [4]


def test_a_client_of_token_ids_gets_no_text_until_the_final_response(inprocess: Any) -> None:
    """A client that did not ask for ``text_output`` (``progress.wants_text``
    False, ``protocol.wants_text``): the streamed responses carry the ids as
    they come and no text, nothing is decoded per token, and the final
    response still carries the whole text and the stats the rollout reads."""
    ENGINE.script = [[4], [5], [6], [7]]
    ENGINE.step_s = 0.02
    decoded: list[list[int]] = []
    text = inprocess.model("baseline").text
    real_decode = text.decode
    text.decode = lambda ids: decoded.append(list(ids)) or real_decode(ids)
    sender, progress = Sender(), Progress(30.0)
    progress.wants_text = False
    try:
        inprocess.run("baseline", _request(max_tokens=4), sender, progress, Cancel())
    finally:
        text.decode = real_decode
    streamed, (final, flags) = sender.sent[:-1], sender.sent[-1]
    assert [t["output_ids"].tolist() for t, _ in streamed] == [[4], [5], [6], [7]]
    assert all("text_output" not in t and not t["is_final"][0] for t, _ in streamed)
    assert flags == FINAL and final["text_output"][0] == b"defg"
    assert final["output_ids"].tolist() == []
    assert decoded == [[4, 5, 6, 7]]  # once, for the final response
    assert int(progress.tracked[-1][0]["completion_tokens"][0]) == 4
    assert progress.tracked[0][0]["output_ids"].tolist() == [4]  # the rollout's first token


@pytest.mark.parametrize(
    "asked",
    [["text_output", "is_final"], ["output_ids"], ["is_final"]],
    ids=["text-and-final", "ids-only", "final-flag-only"],
)
def test_streamed_responses_are_built_of_the_asked_outputs_and_never_pruned(
    inprocess: Any, asked: list[str]
) -> None:
    """Behind the router's ``PruningSender`` a streamed response holds the
    outputs the client asked for and nothing else, so the sender need not
    look at it (``send_exact``): only the final response, with its stats, is
    pruned. The rollout still gets the first token's time, whether or not the
    client asked for the outputs that carry tokens, and the final stats."""
    from trtspec.runtime.threads import PruningSender

    class Request:
        def requested_output_names(self) -> list[str]:
            return asked

    made: list[Response] = []

    def make(**kw: Any) -> Response:
        made.append(Response(**kw))
        return made[-1]

    ENGINE.script = [[4], [5], [6], [7]]
    ENGINE.step_s = 0.02  # a response a token
    raw, progress = Sender(), Progress(30.0)
    progress.wants_text = "text_output" in asked
    router_sender = PruningSender.wrap(raw, Request(), make)
    start = time.monotonic_ns()
    inprocess.run("baseline", _request(max_tokens=4), router_sender, progress, Cancel())
    streamed, (final, flags) = raw.sent[:-1], raw.sent[-1]
    assert len(streamed) == 4 and flags == FINAL
    assert all(sorted(t) == sorted(asked) for t, _ in streamed), streamed
    assert sorted(final) == sorted(asked)
    assert len(made) == 1  # the pruning sender rebuilt the final response alone
    assert progress.sent == 5
    assert progress.first_ns is not None and progress.first_ns > start
    assert int(progress.tracked[-1][0]["completion_tokens"][0]) == 4
    if "text_output" in asked:
        assert b"".join(t["text_output"][0] for t, _ in streamed) == b"defg"
    if "output_ids" in asked:
        assert [t["output_ids"].tolist() for t, _ in streamed] == [[4], [5], [6], [7]]


def test_wants_text_reads_the_clients_requested_outputs(inprocess: Any) -> None:
    from trtspec.runtime.models.protocol import wants_text  # imported by the fixture

    class Request:
        def __init__(self, names: list[str]) -> None:
            self.names = names

        def requested_output_names(self) -> list[str]:
            return self.names

    assert wants_text(Request([]))  # named none: every output
    assert wants_text(Request(["text_output", "is_final"]))
    assert not wants_text(Request(["output_ids", "is_final"]))


def test_tokens_held_by_stream_interval_go_out_before_an_error(inprocess: Any) -> None:
    from trtspec.runtime.models.protocol import CalleeError

    ENGINE.script = [[4], [5], "invalid request: the engine gave up"]
    ENGINE.step_s = 0.02
    inprocess.model("baseline").stream_interval = 4
    sender = Sender()
    with pytest.raises(CalleeError):
        inprocess.run("baseline", _request(max_tokens=8), sender, Progress(30.0), Cancel())
    assert [t["text_output"][0].decode() for t, _ in sender.sent] == ["d", "e"]


@pytest.mark.parametrize("value", ["0", "-2", "four"])
def test_a_bad_stream_interval_parameter_fails_the_model_load(inprocess: Any, value: str) -> None:
    from trtspec.runtime.models import orchestrator

    params = {
        "variant": "v",
        "mode": "none",
        "preprocessing_model": "p",
        "postprocessing_model": "q",
        "target_model": "target",
        "stream_interval": value,
    }
    config = {"name": "v", "parameters": {k: {"string_value": v} for k, v in params.items()}}
    with pytest.raises(RuntimeError, match="v: parameter stream_interval must be a positive"):
        orchestrator.TritonPythonModel().initialize({"model_config": json.dumps(config)})


def test_the_llmapi_adapter_runs_in_process_against_its_llmapi_model(inprocess: Any) -> None:
    """router → llmapi model: the adapter's own request, its deltas relayed
    (what queued up as one), counted, tracked, and its final response named."""
    assert inprocess.kind("ad") == "trtspec.runtime.models.llmapi_adapter"
    ENGINE.script = [[4], [5], [6]]
    sender, progress = Sender(), Progress(30.0)
    inprocess.run("ad", _request(max_tokens=3), sender, progress, Cancel())
    asked = ENGINE.requests[0]
    assert asked["text_input"].tolist() == [b"abc"]
    assert int(asked["sampling_param_max_tokens"][0]) == 3
    texts = [t["text_output"][0].decode() for t, _ in sender.sent]
    assert "".join(texts) == "def" and sender.sent[-1][1] == FINAL
    assert progress.sent == len(sender.sent)
    final = progress.tracked[-1][0]
    assert final["variant"][0] == b"ad" and int(final["completion_tokens"][0]) == 3
    assert progress.first_ns is not None


def test_the_llmapi_adapter_turns_cumulative_text_into_each_answer_once(inprocess: Any) -> None:
    """The llmapi model streams the whole text so far in every response: the
    adapter relays each character once, nothing for a response that adds no
    text (token 0 here, the repeated final one), and counts the completion's
    tokens from the model's last whole text, not from the sum of what it got."""
    ENGINE.script = [[4], [0], [5, 6], [7]]
    sender, progress = Sender(), Progress(30.0)
    inprocess.run("ad", _request(max_tokens=5), sender, progress, Cancel())
    texts = [t["text_output"][0].decode() for t, _ in sender.sent]
    # how many deltas depends on what queued up; the text is the answer once
    assert "".join(texts) == "defg" and texts[-1] == "", texts  # the final carries none
    assert all(texts[:-1]) and [f for _, f in sender.sent][-1] == FINAL
    final = progress.tracked[-1][0]
    assert int(final["completion_tokens"][0]) == 4
    assert final["output_ids"].tolist() == [4, 5, 6, 7]


def test_cumulative_text_becomes_deltas() -> None:
    """``CumulativeText``, the adapter's reading of the llmapi model's
    stream: what each whole text adds to the one before, once."""
    from trtspec.runtime.text import CumulativeText

    text = CumulativeText()
    assert [text.update(w) for w in ("a", "ab", "ab", "abcd", "abcd")] == ["a", "b", "", "cd", ""]
    assert text.whole == "abcd" and not text.revised
    # a later text that does not extend the earlier one (a stop string trimmed):
    # nothing sent is taken back, only characters beyond it go out
    assert text.update("abx") == "" and text.revised and text.whole == "abx"
    assert text.update("abxyz") == "z"


def test_a_stalled_llmapi_model_ends_at_the_routers_deadline(inprocess: Any) -> None:
    from trtspec.runtime.threads import DeadlineExceeded

    ENGINE.script = [[4], "stall"]
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        inprocess.run("ad", _request(), Sender(), Progress(0.5), Cancel())
    assert 0.4 <= time.monotonic() - started < 5
    assert str(info.value).startswith("ad: no answer within its deadline of 0.")


def test_the_router_loads_its_in_process_variants_at_start(inprocess: Any) -> None:
    """``preload`` (the router's ``initialize``) loads every variant that runs
    here, so no first request pays for it; a variant that fails to load is
    reported and left for its first request (which falls back as before);
    a model that is not trtspec's runs over BLS and is not loaded."""
    repo = inprocess.repository
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "config.pbtxt").write_text("this is { not a config")
    (repo / "broken" / "1" / "model.py").write_text(
        "from trtspec.runtime.models.orchestrator import TritonPythonModel\n"
    )
    warnings: list[str] = []
    loaded = inprocess.preload(["ad", "baseline", "broken", "echo", "missing"], warnings.append)
    assert loaded == ["ad", "baseline"]
    assert set(inprocess._models) == {"ad", "baseline"}
    assert len(warnings) == 1
    assert warnings[0].startswith("router: variant 'broken' not loaded in process at start: ")
    with pytest.raises(Exception, match="ModelConfig"):  # its first request meets the error
        inprocess.model("broken")


def test_a_variant_marked_down_mid_request_ends_it_at_once(
    inprocess: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 44: the engine's stub died (the watchdog marked the variant
    down) while a request streamed from it in process: the request ends
    within a few polls, not at its deadline, as a server-side error (the
    router's fallback rule then reads ``sent``: here a token went out)."""
    from trtspec.runtime import health
    from trtspec.runtime.health import DOWN_ENV

    folder = tmp_path / "down"
    monkeypatch.setenv(DOWN_ENV, str(folder))
    ENGINE.script = [[4], "stall"]
    timer = threading.Timer(0.4, health.mark_down, args=(folder, "baseline"))
    timer.start()
    started = time.monotonic()
    sender, progress = Sender(), Progress(60.0)
    with pytest.raises(Exception) as info:
        inprocess.run("baseline", _request(), sender, progress, Cancel())
    assert time.monotonic() - started < 2.5
    assert "variant 'baseline' went down while answering" in str(info.value)
    assert not getattr(info.value, "client", False)  # the server's: worth the fallback
    assert progress.sent == 1  # the token before the stall went out
    timer.join()
    # the LLM-API flow's adapter, in process, the same
    ENGINE.release.set()
    ENGINE.release.clear()
    ENGINE.script = ["stall"]
    (folder / "baseline").unlink()
    timer = threading.Timer(0.4, health.mark_down, args=(folder, "ad"))
    timer.start()
    started = time.monotonic()
    progress = Progress(60.0)
    with pytest.raises(Exception, match="variant 'ad' went down while answering"):
        inprocess.run("ad", _request(), Sender(), progress, Cancel())
    assert time.monotonic() - started < 2.5 and progress.sent == 0  # the fallback's to answer
    timer.join()
