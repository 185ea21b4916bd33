"""trtspec.artifacts.routing: routing.yaml validation (exact messages), the
deterministic canary choice, and the rollout default."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.artifacts.routing import (
    RouteRule,
    RoutingTable,
    canary_bucket,
    choose,
    load_routing,
    parse_routing,
    routing_from_rollout,
)
from trtspec.errors import RepoError

GOOD = """\
schema_version: 1
default_variant: baseline
routes:
  code_completion: {variant: ngram, num_draft_tokens: 4, canary_percent: 100,
                    decision: promote, fallback_variant: baseline}
  chat_short: {variant: baseline, decision: exclude}
"""


def test_load_the_documented_example(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(GOOD)
    table = load_routing(path)
    assert table == RoutingTable(
        "baseline",
        {
            "code_completion": RouteRule("ngram", 4, 100.0, "promote", "baseline"),
            "chat_short": RouteRule("baseline", None, 100.0, "exclude", "baseline"),
        },
    )
    assert parse_routing(table.to_dict()) == table


def test_default_canary_percent_comes_from_the_rollout(tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("routes:\n  code: {variant: ngram}\n")
    assert load_routing(path, default_canary_percent=10).routes["code"].canary_percent == 10.0


@pytest.mark.parametrize(
    ("document", "message", "hint"),
    [
        (
            "routes:\n  code: {variant: ngram, canry_percent: 5}\n",
            "routes.code.canry_percent: unknown key",
            "Allowed keys: variant, num_draft_tokens, canary_percent, decision, fallback_variant, "
            "max_concurrency, draft_len_schedule, evidence.",
        ),
        (
            "routes:\n  code: {variant: ngram, canary_percent: 150}\n",
            "routes.code.canary_percent: must be between 0 and 100, got 150",
            "Use 100 to send all of the route's traffic to its variant.",
        ),
        (
            "routes:\n  code: {num_draft_tokens: 2}\n",
            "routes.code.variant: missing or not a variant name",
            "Name the variant that serves this route, e.g. variant: baseline.",
        ),
        (
            "routes:\n  code: {variant: ngram, num_draft_tokens: 0}\n",
            "routes.code.num_draft_tokens: must be a positive integer, got 0",
            "Remove it to use the variant's default.",
        ),
        (
            "routes:\n  code: {variant: ngram, decision: maybe}\n",
            "routes.code.decision: unknown decision 'maybe'",
            "Use one of: promote, exclude, inconclusive.",
        ),
        (
            "schema_version: 2\n",
            "schema_version: unsupported version 2",
            "Write schema_version: 1.",
        ),
        ("- a\n- b\n", "<root>: expected a mapping", "See docs/design/routing.md."),
    ],
)
def test_bad_routing_files_name_file_and_field(
    tmp_path: Path, document: str, message: str, hint: str
) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text(document)
    with pytest.raises(RepoError) as info:
        load_routing(path)
    assert info.value.message == f"{path}: {message}"
    assert info.value.hint == hint


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(RepoError) as info:
        load_routing(tmp_path / "missing.yaml")
    assert info.value.message == (
        f"{tmp_path / 'missing.yaml'}: cannot read the routing file: No such file or directory"
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: {code: [\n")
    with pytest.raises(RepoError) as info:
        load_routing(bad)
    assert info.value.message.startswith(f"{bad}: not valid YAML: ")


def test_canary_bucket_is_stable_and_spread() -> None:
    assert canary_bucket("req-1") == canary_bucket("req-1")
    buckets = [canary_bucket(f"req-{i}") for i in range(2000)]
    assert all(0 <= b < 10000 for b in buckets)
    share = sum(b < 2500 for b in buckets) / len(buckets)
    assert 0.2 < share < 0.3


def test_choose_sends_the_canary_share_to_the_route_variant() -> None:
    table = RoutingTable("baseline", {"code": RouteRule("ngram", 4, 25.0)})
    ids = [f"r{i}" for i in range(400)]
    choices = [choose(table, "code", i) for i in ids]
    canaries = [c for c in choices if c.canary]
    assert {c.variant for c in canaries} == {"ngram"}
    assert {c.num_draft_tokens for c in canaries} == {4}
    assert {c.variant for c in choices if not c.canary} == {"baseline"}
    assert len(canaries) == sum(canary_bucket(i) < 2500 for i in ids)
    assert 70 < len(canaries) < 130


def test_choose_edges() -> None:
    table = RoutingTable(
        "baseline", {"all": RouteRule("draft", None, 100.0), "none": RouteRule("draft", None, 0.0)}
    )
    assert all(choose(table, "all", f"x{i}").variant == "draft" for i in range(50))
    assert all(choose(table, "none", f"x{i}").variant == "baseline" for i in range(50))
    unknown = choose(table, "other", "x")
    assert (unknown.variant, unknown.fallback_variant, unknown.canary) == (
        "baseline",
        "baseline",
        False,
    )
    assert choose(table, None, "x").variant == "baseline"


def test_rollout_default_routes_everything_to_the_fallback() -> None:
    table = routing_from_rollout("baseline")
    assert table.to_dict() == {"schema_version": 1, "default_variant": "baseline", "routes": {}}
    assert choose(table, "code", "r1").variant == "baseline"
