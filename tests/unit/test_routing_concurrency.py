"""routing.yaml ``max_concurrency``: parsed strictly, round-tripped, and enforced
per route by ``InFlight`` (the router's counter): over the limit a request
goes to the route's fallback, and a finished one frees its place."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.artifacts.routing import InFlight, choose, load_routing, parse_routing
from trtspec.errors import RepoError


def test_max_concurrency_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(
        "routes:\n  code: {variant: ngram, max_concurrency: 4}\n  chat: {variant: ngram}\n"
    )
    table = load_routing(path)
    assert table.routes["code"].max_concurrency == 4
    assert table.routes["chat"].max_concurrency is None
    data = table.to_dict()
    assert data["routes"]["code"]["max_concurrency"] == 4
    assert "max_concurrency" not in data["routes"]["chat"]
    assert parse_routing(data) == table


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "true", "many"])
def test_bad_max_concurrency_names_file_and_field(tmp_path: Path, value: str) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(f"routes:\n  code: {{variant: ngram, max_concurrency: {value}}}\n")
    with pytest.raises(RepoError) as info:
        load_routing(path)
    shown = {"true": "True", "many": "'many'"}.get(value, value)
    assert info.value.message == (
        f"{path}: routes.code.max_concurrency: must be a positive integer, got {shown}"
    )
    assert info.value.hint == "Remove it to send the route to its variant at any load."


def test_in_flight_sends_requests_over_the_limit_to_the_fallback() -> None:
    table = parse_routing(
        {
            "routes": {
                "code": {"variant": "ngram", "max_concurrency": 2},
                "chat": {"variant": "ngram"},
            }
        }
    )
    limiter = InFlight()
    admitted = [limiter.admit(table, "code", choose(table, "code", f"r{i}")) for i in range(3)]
    assert [c.variant for c in admitted] == ["ngram", "ngram", "baseline"]
    assert limiter.count("code") == 2
    # a route without a limit is never redirected
    assert {
        limiter.admit(table, "chat", choose(table, "chat", f"c{i}")).variant for i in range(5)
    } == {"ngram"}
    for choice in admitted:
        limiter.release(table, "code", choice)
    assert limiter.count("code") == 0
    assert limiter.admit(table, "code", choose(table, "code", "again")).variant == "ngram"
