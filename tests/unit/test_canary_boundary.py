"""The canary split on its boundaries: request ids whose bucket is 0, the
last bucket under the share, the share's own bucket and the last bucket of
all, at 0%, 5% and 100%. Random ids almost never land on these, so a
``<=`` for ``<`` (5% silently 5.01%, 0% sending some traffic) shows only
here."""

from __future__ import annotations

import itertools

import pytest

from trtspec.artifacts.routing import RouteRule, RoutingTable, canary_bucket, choose

BUCKETS = 10000  # canary_bucket's range: hundredths of a percent


def _id_in_bucket(bucket: int) -> str:
    """The first ``edge-<n>`` request id whose bucket is ``bucket`` (found by
    search: about 10,000 hashes on average)."""
    for n in itertools.count():
        rid = f"edge-{n}"
        if canary_bucket(rid) == bucket:
            return rid
        assert n < 40 * BUCKETS, f"no id found in bucket {bucket}"
    raise AssertionError  # unreachable; itertools.count never ends


@pytest.fixture(scope="module")
def ids() -> dict[int, str]:
    return {b: _id_in_bucket(b) for b in (0, 499, 500, BUCKETS - 1)}


@pytest.mark.parametrize(
    ("percent", "canaries"),
    [
        (0.0, set()),  # 0%: nothing, not even bucket 0
        (5.0, {0, 499}),  # 5%: buckets 0..499, the share's own bucket (500) not
        (100.0, {0, 499, 500, BUCKETS - 1}),  # 100%: everything, the last bucket too
    ],
)
def test_choose_on_the_bucket_boundaries(ids: dict[int, str], percent: float, canaries) -> None:
    table = RoutingTable("baseline", {"code": RouteRule("ngram", 4, percent)})
    for bucket, rid in ids.items():
        assert canary_bucket(rid) == bucket
        picked = choose(table, "code", rid)
        want = bucket in canaries
        assert picked.canary is want, (percent, bucket, rid)
        assert picked.variant == ("ngram" if want else "baseline")
        assert picked.fallback_variant == "baseline"


def test_a_fractional_share_rounds_to_its_hundredth(ids: dict[int, str]) -> None:
    """4.995% and 5.004% both cover buckets 0..499 (the share in hundredths)."""
    for percent in (4.995, 5.004):
        table = RoutingTable("baseline", {"code": RouteRule("ngram", None, percent)})
        assert choose(table, "code", ids[499]).canary
        assert not choose(table, "code", ids[500]).canary
