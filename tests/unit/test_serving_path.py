"""benchmarks/serving_path.py's summary: the ``same`` column compares each
layer's token ids with the in-process engine's, and says it cannot tell
(rather than "False") when that reference was not measured."""

from __future__ import annotations

from typing import Any

from tests.fixtures.benchmarks import benchmark_module


def _serving_path() -> Any:
    return benchmark_module("serving_path")


def _row(sp: Any, layer: str, level: int, ids: dict[str, list[int]]) -> Any:
    runs = [sp.Run(prompt=p, sent=0.0, first=0.1, last=0.2, ids=list(v)) for p, v in ids.items()]
    return sp.Row("tiny", layer, level, runs, wall_s=1.0)


def _same(lines: list[dict[str, Any]], layer: str, level: int) -> Any:
    (line,) = [r for r in lines if (r["layer"], r["level"]) == (layer, level)]
    return line["same_ids_as_in_process"]


def test_same_is_unknown_without_the_in_process_reference() -> None:
    sp = _serving_path()
    lines = sp.summarise(
        [_row(sp, "engine", 4, {"a": [1, 2]}), _row(sp, "router", 4, {"a": [1, 2]})]
    )
    assert _same(lines, "engine", 4) is None
    assert _same(lines, "router", 4) is None
    assert sp._same(None) == "-"


def test_same_compares_every_layer_with_the_in_process_ids() -> None:
    sp = _serving_path()
    rows = [
        _row(sp, "in-process", 1, {"a": [1, 2], "b": [3]}),
        _row(sp, "engine", 4, {"a": [1, 2], "b": [3]}),
        _row(sp, "router", 4, {"a": [1, 2], "b": [4]}),
    ]
    lines = sp.summarise(rows)
    assert _same(lines, "engine", 4) is True
    assert _same(lines, "router", 4) is False


def test_a_failed_run_is_not_compared() -> None:
    sp = _serving_path()
    router = _row(sp, "router", 1, {"a": [1, 2]})
    router.runs.append(sp.Run(prompt="unmeasured", sent=0.0, error="stub died"))
    lines = sp.summarise([_row(sp, "in-process", 1, {"a": [1, 2]}), router])
    assert _same(lines, "router", 1) is True
    crashed = _row(sp, "engine", 1, {})
    crashed.runs.append(sp.Run(prompt="a", sent=0.0, error="stub died"))
    lines = sp.summarise([_row(sp, "in-process", 1, {"a": [1, 2]}), crashed])
    assert _same(lines, "engine", 1) is None  # nothing answered: not "the same"


def test_cores_busy_counts_server_and_client_over_the_cell() -> None:
    sp = _serving_path()
    row = _row(sp, "router", 4, {"a": [1, 2]})
    row.wall_s = 2.0
    row.cpu_s = {"tritonserver": 0.5, "router": 1.0, sp.CLIENT: 0.5}
    (line,) = sp.summarise([row])
    assert line["cores_busy"] == 1.0
    (alone,) = sp.summarise([_row(sp, "in-process", 1, {"a": [1, 2]})])
    assert alone["cores_busy"] is None  # nothing measured: not "idle"


def test_floor_lines_set_the_relay_against_both_items_references() -> None:
    sp = _serving_path()

    def line(layer: str, level: int, tok_s: float) -> dict[str, Any]:
        return {"model": "tiny", "layer": layer, "level": level, "tok_s": tok_s}

    lines = [
        line("in-process", 1, 500.0),
        line("relay", 1, 450.0),
        line("router", 1, 405.0),
        line("engine", 4, 1000.0),
        line("relay", 4, 750.0),
    ]
    one, four = sp.floor_lines(lines)
    assert "(4) tiny x1: the bare relay keeps 90.0% of the engine in process" in one
    assert "the router keeps 90.0% of the relay's tokens/s" in one
    assert four == "(5) tiny x4: the bare relay keeps 75.0% of the engine model alone"
    assert sp.floor_lines(lines[3:4]) == []  # no relay measured (--no-relay)
