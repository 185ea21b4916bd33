"""The reference engine model builds only the perf outputs its caller asked
for (``triton_model._perf_tensors``): the orchestrator asks for one of the ten
(``kv_cache_reused_blocks``) in every streamed response, and each
``pb_utils.Tensor`` costs the stub CPU. tests/integration/test_engine_served.py
reads every one of them back from a served engine when all are asked for."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest

from trtspec.runtime.contract import PERF_OUTPUTS
from trtspec.runtime.engine import triton_model


class Tensor:
    made: ClassVar[list[str]] = []

    def __init__(self, name: str, array: np.ndarray) -> None:
        Tensor.made.append(name)
        self._name, self.array = name, array

    def name(self) -> str:
        return self._name


GEN = SimpleNamespace(
    output_ids=[5, 6, 7],
    reused_tokens=64,
    arrival_time_ns=11,
    first_scheduled_time_ns=12,
    first_token_time_ns=13,
    last_token_time_ns=14,
    acceptance_rate=0.5,
    total_accepted_draft_tokens=2,
    total_draft_tokens=4,
)


@pytest.fixture(autouse=True)
def fake_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_model, "pb_utils", SimpleNamespace(Tensor=Tensor), raising=False)
    Tensor.made = []


def _values(tensors: list[Any]) -> dict[str, Any]:
    return {t.name(): t.array.reshape(-1)[0].item() for t in tensors}


def test_only_the_perf_outputs_asked_for_are_built() -> None:
    out = triton_model._perf_tensors(GEN, 70, 32, {"output_ids", "kv_cache_reused_blocks"})
    assert _values(out) == {"kv_cache_reused_blocks": 2}
    assert Tensor.made == ["kv_cache_reused_blocks"]  # nothing built to be thrown away


def test_every_perf_output_when_all_are_asked_for() -> None:
    names = set(PERF_OUTPUTS)  # the contract: every perf output of 0.19 on
    values = _values(triton_model._perf_tensors(GEN, 70, 32, names))
    assert set(values) == names
    # 73 tokens: three 32-token blocks, two of them reused
    assert values["kv_cache_alloc_total_blocks"] == 3
    assert values["kv_cache_alloc_new_blocks"] == 1
    assert values["total_draft_tokens"] == 4 and values["acceptance_rate"] == 0.5
