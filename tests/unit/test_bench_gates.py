"""``--fail-on`` parsing (exact messages) and evaluation against summary cells."""

from __future__ import annotations

import pytest

from trtspec.bench.gates import Gate, check_gates, parse_gates
from trtspec.errors import BenchError


def _cell(
    route: str, variant: str, speedup: float | None, error_rate: float = 0.0, k: int | None = None
) -> dict:
    return {
        "route": route,
        "variant": variant,
        "num_speculative_tokens": k,
        "load": "concurrency=1",
        "temperature": 0.0,
        "error_rate": error_rate,
        "speedup": None
        if speedup is None
        else {"point": speedup, "ci_low": speedup - 0.1, "ci_high": speedup + 0.1},
        "ttft_ms": {"p50": 10.0, "p95": 20.0},
        "latency_ms": {"p50": 100.0, "p95": 150.0},
    }


def test_parse_the_issue_example() -> None:
    gates = parse_gates("speedup<1.0@code_completion, error_rate>0.01")
    assert gates == [
        Gate("speedup", "<", 1.0, "code_completion", None),
        Gate("error_rate", ">", 0.01, None, None),
    ]
    assert str(gates[0]) == "speedup<1@code_completion"


def test_parse_variant_and_two_char_ops() -> None:
    assert parse_gates("ttft_p95_ms>=250@chat_short/ngram") == [
        Gate("ttft_p95_ms", ">=", 250.0, "chat_short", "ngram")
    ]
    assert parse_gates("") == []
    assert parse_gates(None) == []


def test_parse_errors_are_exact() -> None:
    with pytest.raises(BenchError) as exc:
        parse_gates("speedup=1.0")
    assert exc.value.message == "--fail-on: cannot parse 'speedup=1.0'"
    assert exc.value.hint == (
        "write gates as METRIC<VALUE[@ROUTE[/VARIANT]], comma-separated, "
        'e.g. --fail-on "speedup<1.0@code_completion,error_rate>0.01"'
    )
    with pytest.raises(BenchError) as exc:
        parse_gates("sped<1")
    assert exc.value.message == "--fail-on: unknown metric 'sped' in 'sped<1'"
    assert exc.value.hint is not None
    assert exc.value.hint.startswith("did you mean 'speedup'? known metrics: acceptance_rate,")
    with pytest.raises(BenchError) as exc:
        parse_gates("speedup<1.2.3")
    assert exc.value.message == "--fail-on: '1.2.3' is not a number in 'speedup<1.2.3'"


def test_check_gates_finds_breaches_per_route() -> None:
    cells = [
        _cell("code_completion", "baseline", None),
        _cell("code_completion", "ngram", 0.9, k=4),
        _cell("chat_short", "ngram", 0.8, error_rate=0.05, k=4),
    ]
    breaches = check_gates(parse_gates("speedup<1.0@code_completion"), cells)
    assert [(b.route, b.variant, b.observed) for b in breaches] == [
        ("code_completion", "ngram", 0.9)
    ]
    assert str(breaches[0]) == (
        "speedup<1@code_completion: speedup=0.9 at "
        "route=code_completion variant=ngram (concurrency=1 T=0.0 k=4)"
    )
    # unscoped gate applies everywhere; the baseline has no speedup and is skipped
    assert len(check_gates(parse_gates("speedup<1.0"), cells)) == 2
    errs = check_gates(parse_gates("error_rate>0.01"), cells)
    assert [(b.route, b.observed) for b in errs] == [("chat_short", 0.05)]
    assert check_gates(parse_gates("speedup<0.5"), cells) == []


def test_check_gates_unknown_route_or_variant_is_an_error() -> None:
    cells = [_cell("code_completion", "ngram", 1.2)]
    with pytest.raises(BenchError) as exc:
        check_gates(parse_gates("speedup<1@json_output"), cells)
    assert exc.value.message == (
        "--fail-on: speedup<1@json_output names route 'json_output', which this run did not bench"
    )
    assert exc.value.hint == "routes in this run: code_completion"
    with pytest.raises(BenchError) as exc:
        check_gates(parse_gates("speedup<1@code_completion/eagle"), cells)
    assert exc.value.message == (
        "--fail-on: speedup<1@code_completion/eagle names variant "
        "'eagle', which this run did not bench"
    )
