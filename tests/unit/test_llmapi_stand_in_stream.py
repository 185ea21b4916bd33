"""The CPU stand-in of Triton's ``llmapi`` model streams as upstream's does,
checked in process and fast (the served e2e test checks it too): every
answering iteration's ``text_output`` is the whole text so far, changed or
not, and the final response repeats the whole answer. Upstream:
``_create_response`` puts ``CompletionOutput.text`` into ``text_output``
(triton_backend/all_models/llmapi/tensorrt_llm/1/model.py at b35ac1b6 and
044a90d2), and ``text`` is cumulative (tensorrt_llm/executor/result.py at
005bc848: ``text_diff = text[_last_text_len:]``). The model runs with a
stand-in ``triton_python_backend_utils`` (tensors, responses, the final
flag) and a scripted scheduler in place of the reference engine, so the
text path is the stand-in's own (tokenizer, ``IncrementalText``,
``stream_interval``)."""

from __future__ import annotations

import itertools
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tests.fixtures.tiny_model import train_tokenizer

from trtspec.runtime.engine import llmapi_model

FINAL = 1
ANSWER = "The quick brown fox jumps over the lazy dog."


class _Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name, self.array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Response:
    def __init__(self, output_tensors: list[_Tensor] | None = None, error: Any = None) -> None:
        self.tensors = {t.name(): t.as_numpy() for t in output_tensors or []}
        self.error = error


class _Sender:
    def __init__(self) -> None:
        self.sent: list[tuple[_Response, int]] = []

    def send(self, response: _Response | None = None, flags: int = 0) -> None:
        assert response is not None
        self.sent.append((response, flags))


class _Scheduler:
    """The reference engine's scheduler, scripted: one token list per
    decoding iteration."""

    def __init__(self, iterations: list[list[int]]) -> None:
        self.iterations = iterations

    def submit(self, _request: Any, *, is_cancelled: Any) -> Iterator[list[int]]:
        return iter(self.iterations)


class _NotCancelled:
    def is_cancelled(self) -> bool:
        return False


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok")
    train_tokenizer(path)
    return path


@pytest.fixture
def stub(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor = _Tensor  # type: ignore[attr-defined]
    pb.InferenceResponse = _Response  # type: ignore[attr-defined]
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = FINAL  # type: ignore[attr-defined]
    pb.get_input_tensor_by_name = lambda request, name: request.get(name)  # type: ignore[attr-defined]
    monkeypatch.setattr(llmapi_model, "pb_utils", pb)
    return pb


def _model(tokenizer_dir: Path, iterations: list[list[int]], stream_interval: int) -> Any:
    model = object.__new__(llmapi_model.TritonPythonModel)
    model.name, model.decoupled = "llm", True
    model.speculation, model.acceptance_zeroed = None, True
    model.stream_interval = stream_interval
    model._load_tokenizer({"tokenizer": str(tokenizer_dir)}, tokenizer_dir)
    model.scheduler = _Scheduler(iterations)
    return model


def _request(max_tokens: int) -> dict[str, _Tensor]:
    return {
        "text_input": _Tensor("text_input", np.array([b"Say it"], dtype=np.object_)),
        "streaming": _Tensor("streaming", np.array([True])),
        "sampling_param_max_tokens": _Tensor("sampling_param_max_tokens", np.array([max_tokens])),
    }


@pytest.mark.parametrize(("interval", "answering"), [(1, [1, 2, 3, 4, 5, 6]), (2, [1, 2, 4, 6])])
def test_every_answer_is_the_whole_text_so_far(
    stub: types.ModuleType, tokenizer_dir: Path, interval: int, answering: list[int]
) -> None:
    model = _model(tokenizer_dir, [], interval)
    ids = model.tokenizer.encode(ANSWER)
    assert model.tokenizer.decode(ids) == ANSWER and len(ids) >= 8
    # six iterations: one token each, except one of two and the last of the rest
    iterations = [ids[:1], ids[1:3], ids[3:4], ids[4:5], ids[5:6], ids[6:]]
    model.scheduler = _Scheduler(iterations)
    sender = _Sender()
    model._generate(_request(len(ids)), sender, _NotCancelled())

    texts = [r.tensors["text_output"][0].decode() for r, _ in sender.sent]
    flags = [f for _, f in sender.sent]
    assert flags == [0] * len(answering) + [FINAL]
    ends = [sum(len(it) for it in iterations[:n]) for n in answering]
    # each answering iteration: the whole text so far (never what it added alone)
    assert texts[:-1] == [model.tokenizer.decode(ids[:end]) for end in ends]
    assert all(b.startswith(a) for a, b in itertools.pairwise(texts))
    assert texts[-1] == ANSWER  # the final response repeats the whole answer


def test_an_iteration_that_adds_no_text_still_answers_with_the_whole_text(
    stub: types.ModuleType, tokenizer_dir: Path
) -> None:
    """Upstream answers every answering iteration, its text changed or not:
    a token that completes no character yet (half of a multi-byte one) sends
    the same whole text again, not an empty delta or nothing."""
    model = _model(tokenizer_dir, [], 1)
    ids = model.tokenizer.encode("ab✓")
    # the check mark's three bytes span several tokens of the byte-level BPE
    split = next(i for i in range(len(ids) + 1) if model.tokenizer.decode(ids[:i]) == "ab")
    assert len(ids) - split >= 2
    iterations = [ids[:split], *([token] for token in ids[split:])]
    model.scheduler = _Scheduler(iterations)
    sender = _Sender()
    model._generate(_request(len(ids)), sender, _NotCancelled())
    texts = [r.tensors["text_output"][0].decode() for r, _ in sender.sent]
    assert len(texts) == len(iterations) + 1  # every iteration answered, then the final
    assert texts[:-2] == ["ab"] * (len(iterations) - 1)  # no character completed: "ab" again
    assert texts[-2:] == ["ab✓", "ab✓"]
