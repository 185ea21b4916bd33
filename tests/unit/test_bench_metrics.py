"""The benchmark's metrics, declared once (``trtspec.bench.metrics``): each
has a unit and a computation, the gates read cells through them, and a
metric reads the cell key it names (a distribution's statistic, a plain
value, or None where the cell has none)."""

from __future__ import annotations

from trtspec.bench import gates
from trtspec.bench.metrics import BY_NAME, METRICS

CELL = {
    "speedup": {"point": 1.4, "ci_low": 1.1, "ci_high": 1.7},
    "error_rate": 0.0,
    "acceptance_rate": 0.62,
    "mean_accepted_length": 2.5,
    "tokens_per_second": {"mean": 40.0, "p50": 39.0},
    "ttft_ms": {"p50": 12.0, "p95": 30.0},
    "latency_ms": {"p50": 200.0, "p95": 410.0},
    "tpot_ms": {"p50": 5.0, "p95": 9.0},
    "equal_rate": None,
}


def test_each_metric_is_declared_once_with_a_unit_and_a_computation() -> None:
    assert len(BY_NAME) == len(METRICS)
    assert all(m.unit and m.computed and m.key for m in METRICS)
    assert set(gates.METRICS) == set(BY_NAME)  # every gate is a declared metric


def test_a_metric_reads_its_place_in_a_cell() -> None:
    read = {m.name: m.read(CELL) for m in METRICS}
    assert read["speedup"] == 1.4 and read["speedup_ci_low"] == 1.1
    assert read["ttft_p95_ms"] == 30.0 and read["tpot_p50_ms"] == 5.0
    assert read["tokens_per_second"] == 40.0 and read["acceptance_rate"] == 0.62
    assert read["equal_rate"] is None and read["quality_pass_rate"] is None
    assert BY_NAME["latency_p95_ms"].read({}) is None


def test_the_gates_read_cells_through_the_metrics() -> None:
    (gate,) = gates.parse_gates("ttft_p95_ms>25")
    breaches = gates.check_gates([gate], [{**CELL, "route": "r", "variant": "v"}])
    assert [str(b.gate) for b in breaches] == ["ttft_p95_ms>25"]
