"""The orchestrator's confidence-driven draft (``draft_schedule: confidence``)
in process, without Triton: the model module is imported with a stand-in
``triton_python_backend_utils`` (only ``Tensor`` and
``get_output_tensor_by_name`` are used on this path), and its BLS call is
answered by a scripted draft engine. Checked: one draft call per token, each
asking for one token and its logits, each with the round's own seed; the
draft stops after the first token below the threshold; the rows reach the
target when it accepts by logits; a draft engine without logits is a clear
error. No tritonserver is started for it (the suite's budget); the same
``speculate.draft_until_unsure`` loop runs against the real reference engines
in tests/unit/test_engine_decode.py (lossless at T=0)."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from trtspec.runtime.speculate import draft_call_seed

VOCAB = 16


class _Tensor:
    def __init__(self, name: str, array: Any) -> None:
        self._name, self.array = name, np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self.array


class _Reply(dict):
    """A BLS response: its tensors by name, and ``output_tensors()``."""

    def output_tensors(self) -> list[_Tensor]:
        return list(self.values())


def _get(response: Any, name: str) -> Any:
    return response.get(name)


@pytest.fixture
def orchestrator(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    stub = types.ModuleType("triton_python_backend_utils")
    stub.Tensor = _Tensor  # type: ignore[attr-defined]
    stub.get_output_tensor_by_name = _get  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub)
    name = "trtspec.runtime.models.orchestrator"
    monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module(name)
    yield module
    sys.modules.pop(name, None)  # the next importer gets the real stub's module


def _row(token: int, probability: float) -> np.ndarray:
    """Logits over VOCAB whose softmax gives ``token`` exactly ``probability``."""
    rest = (1.0 - probability) / (VOCAB - 1)
    probs = np.full(VOCAB, rest)
    probs[token] = probability
    return np.log(probs).astype(np.float32)


class _Draft:
    """A scripted draft engine: position i of a round's draft is token
    ``10 + i`` with probability ``confidence[i]``; records every call."""

    def __init__(self, confidence: list[float], logits: bool = True) -> None:
        self.confidence, self.logits, self.calls = confidence, logits, []

    def __call__(self, model_name: str, tensors: list, outputs: list[str]) -> _Reply:
        inputs = {t.name(): t.as_numpy() for t in tensors}
        self.calls.append((model_name, inputs, outputs))
        i = len(self.calls) - 1
        token = 10 + i
        reply = _Reply(
            output_ids=_Tensor("output_ids", [[[token]]]),
            sequence_length=_Tensor("sequence_length", [[1]]),
        )
        if self.logits:
            row = _row(token, self.confidence[i])
            reply["generation_logits"] = _Tensor("generation_logits", row.reshape(1, 1, 1, VOCAB))
        return reply


def _generation(module: Any, draft: _Draft, *, use_draft_logits: bool, temperature=None):
    model = types.SimpleNamespace(
        draft_model="draft_x",
        use_draft_logits=use_draft_logits,
        seed_input="seed",
        perf_metrics=False,
        reuse_stats_input="",
    )
    params = types.SimpleNamespace(temperature=temperature, top_k=None, top_p=None, seed=None)
    gen = object.__new__(module._Generation)
    gen.model, gen.params, gen.end_id, gen.pad_id = model, params, 2, 0
    gen._call = draft
    return gen


def test_one_call_per_token_until_the_draft_is_unsure(orchestrator) -> None:
    draft = _Draft([0.9, 0.6, 0.3, 0.95, 0.95])
    gen = _generation(orchestrator, draft, use_draft_logits=False)
    tokens, rows = gen.draft_until_unsure([5, 6, 7], 5, 0.4, seed=None)
    assert tokens == [10, 11, 12]  # the unsure third token is drafted, then it stops
    assert rows is None  # matching: no rows for the target
    assert len(draft.calls) == 3
    for j, (name, inputs, outputs) in enumerate(draft.calls):
        assert name == "draft_x"
        assert inputs["input_ids"].tolist() == [[5, 6, 7, *tokens[:j]]]
        assert inputs["request_output_len"].tolist() == [[1]]
        assert inputs["return_generation_logits"].tolist() == [[True]]
        assert "seed" not in inputs  # greedy, no request seed: none sent
        assert "generation_logits" in outputs


def test_the_cap_ends_a_confident_draft_and_rows_go_to_the_target(orchestrator) -> None:
    draft = _Draft([0.99] * 6)
    gen = _generation(orchestrator, draft, use_draft_logits=True, temperature=0.7)
    tokens, rows = gen.draft_until_unsure([5], 4, 0.4, seed=77)
    assert tokens == [10, 11, 12, 13] and len(draft.calls) == 4
    assert rows is not None and rows.shape == (4, VOCAB)
    assert [int(np.argmax(r)) for r in rows] == tokens
    # every call of the round draws with its own seed, the first with the round's
    seeds = [int(inputs["seed"][0, 0]) for _, inputs, _ in draft.calls]
    assert seeds == [draft_call_seed(77, j) for j in range(4)] and seeds[0] == 77
    assert len(set(seeds)) == 4


def test_the_threshold_reads_the_tempered_distribution(orchestrator) -> None:
    # p = 0.5 at T=1 is confident for 0.4; at T=2 the same logits spread out
    # below 0.4, so the draft stops after its first token
    assert _generation(orchestrator, _Draft([0.5] * 3), use_draft_logits=False).draft_until_unsure(
        [1], 3, 0.4, seed=None
    )[0] == [10, 11, 12]
    hot = _generation(orchestrator, _Draft([0.5] * 3), use_draft_logits=False, temperature=2.0)
    assert hot.draft_until_unsure([1], 3, 0.4, seed=5)[0] == [10]


def test_a_draft_engine_without_logits_is_a_clear_error(orchestrator) -> None:
    gen = _generation(orchestrator, _Draft([0.9], logits=False), use_draft_logits=False)
    with pytest.raises(RuntimeError, match="draft_x returned no generation_logits; draft_schedule"):
        gen.draft_until_unsure([1], 3, 0.4, seed=None)
