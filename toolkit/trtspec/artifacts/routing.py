"""The routing table (docs/design/routing.md): loading and validating
``routing.yaml``, the fallback table derived from a spec's ``rollout`` when
there is none, and the router's deterministic choice of a variant per request
(canary bucket from a hash of the request id). Pure and stdlib-only at import
time, because the router model imports it inside a Python backend stub.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from trtspec.catalogue import BASELINE
from trtspec.errors import RepoError

ROUTING_YAML = "routing.yaml"  # written by `trtspec bench` into its run folder
SCHEMA_VERSION = 1


class Evidence(TypedDict):
    """What a promoted entry rests on (read by people; the router ignores it)."""

    speedup: float
    speedup_ci: list[float]
    confidence: float
    tokens_per_second_change: float
    latency_change: float
    pairs: int
    load: str
    temperature: float
    temperatures: list[float]


class RouteEntry(TypedDict, total=False):
    """One route of routing.yaml as `trtspec bench` writes it (``parse_routing``
    reads it back into a ``RouteRule``)."""

    variant: str
    num_draft_tokens: int
    canary_percent: float
    decision: str  # promote | exclude | inconclusive
    fallback_variant: str
    max_concurrency: int
    draft_len_schedule: dict[int, int]
    evidence: Evidence


class RoutingDocument(TypedDict):
    """routing.yaml as `trtspec bench` writes it."""

    schema_version: int
    default_variant: str
    routes: dict[str, RouteEntry]
    fingerprint: NotRequired[dict[str, Any] | None]  # what the decisions were measured on


# ``evidence`` (the benchmark's paired estimate behind a promote) is for
# people reading routing.yaml; the router does not use it.
ROUTE_KEYS = (
    "variant",
    "num_draft_tokens",
    "canary_percent",
    "decision",
    "fallback_variant",
    "max_concurrency",
    "draft_len_schedule",
    "evidence",
)
DECISIONS = ("promote", "exclude", "inconclusive")


@dataclass(frozen=True)
class RouteRule:
    variant: str
    num_draft_tokens: int | None = None
    canary_percent: float = 100.0
    decision: str | None = None
    fallback_variant: str = BASELINE
    # Most in-flight requests of this route the variant serves at once; the
    # rest go to the fallback (a variant that wins only under light load).
    max_concurrency: int | None = None
    # ((in-flight level, draft length), …) ascending: the draft length the
    # bench found best at each load, applied by the route's own in-flight
    # count (the largest level ≤ the count; the lowest below it)
    draft_len_schedule: tuple[tuple[int, int], ...] | None = None

    def draft_len_at(self, in_flight: int) -> int | None:
        if not self.draft_len_schedule:
            return self.num_draft_tokens
        k = self.draft_len_schedule[0][1]
        for level, length in self.draft_len_schedule:
            if level <= in_flight:
                k = length
        return k


@dataclass(frozen=True)
class RoutingTable:
    default_variant: str = BASELINE
    routes: dict[str, RouteRule] = field(default_factory=dict)
    # what `trtspec bench` measured (trtspec.fingerprint); not sent to the router
    fingerprint: dict[str, Any] | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        routes: dict[str, Any] = {}
        for name, rule in self.routes.items():
            entry: dict[str, Any] = {"variant": rule.variant}
            if rule.num_draft_tokens is not None:
                entry["num_draft_tokens"] = rule.num_draft_tokens
            entry["canary_percent"] = rule.canary_percent
            if rule.decision is not None:
                entry["decision"] = rule.decision
            entry["fallback_variant"] = rule.fallback_variant
            if rule.max_concurrency is not None:
                entry["max_concurrency"] = rule.max_concurrency
            if rule.draft_len_schedule:
                entry["draft_len_schedule"] = dict(rule.draft_len_schedule)
            routes[name] = entry
        return {
            "schema_version": SCHEMA_VERSION,
            "default_variant": self.default_variant,
            "routes": routes,
        }

    def variants(self) -> set[str]:
        names = {self.default_variant}
        for rule in self.routes.values():
            names.update((rule.variant, rule.fallback_variant))
        return names


@dataclass(frozen=True)
class Choice:
    """What the router does with one request."""

    variant: str
    fallback_variant: str
    num_draft_tokens: int | None
    canary: bool  # True when the route's (speculative) variant was picked


def _bad(source: str, field_path: str, message: str, hint: str) -> RepoError:
    return RepoError(f"{source}: {field_path}: {message}", hint)


def parse_routing(
    data: Any, source: str = "routing.yaml", *, default_canary_percent: float = 100.0
) -> RoutingTable:
    """Validate a loaded routing document; errors name ``source`` and the field."""
    if not isinstance(data, dict):
        raise _bad(source, "<root>", "expected a mapping", "See docs/design/routing.md.")
    version = data.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise _bad(
            source,
            "schema_version",
            f"unsupported version {version!r}",
            f"Write schema_version: {SCHEMA_VERSION}.",
        )
    unknown = sorted(set(data) - {"schema_version", "default_variant", "routes", "fingerprint"})
    if unknown:
        raise _bad(
            source,
            unknown[0],
            "unknown key",
            "Allowed keys: schema_version, default_variant, routes, fingerprint.",
        )
    fingerprint = data.get("fingerprint")
    if fingerprint is not None and not isinstance(fingerprint, dict):
        raise _bad(
            source,
            "fingerprint",
            "expected a mapping",
            "Leave it as `trtspec bench` wrote it, or delete it.",
        )
    default = data.get("default_variant", BASELINE)
    if not isinstance(default, str) or not default:
        raise _bad(source, "default_variant", "must be a variant name", "e.g. baseline")
    raw_routes = data.get("routes") or {}
    if not isinstance(raw_routes, dict):
        raise _bad(
            source,
            "routes",
            "expected a mapping of route name to settings",
            "e.g. routes: {chat: {variant: ngram}}",
        )
    routes: dict[str, RouteRule] = {}
    for name, entry in raw_routes.items():
        where = f"routes.{name}"
        if not isinstance(entry, dict):
            raise _bad(source, where, "expected a mapping", "e.g. {variant: ngram}")
        extra = sorted(set(entry) - set(ROUTE_KEYS))
        if extra:
            raise _bad(
                source,
                f"{where}.{extra[0]}",
                "unknown key",
                "Allowed keys: " + ", ".join(ROUTE_KEYS) + ".",
            )
        variant = entry.get("variant")
        if not isinstance(variant, str) or not variant:
            raise _bad(
                source,
                f"{where}.variant",
                "missing or not a variant name",
                "Name the variant that serves this route, e.g. variant: baseline.",
            )
        ndt = entry.get("num_draft_tokens")
        if ndt is not None and (isinstance(ndt, bool) or not isinstance(ndt, int) or ndt < 1):
            raise _bad(
                source,
                f"{where}.num_draft_tokens",
                f"must be a positive integer, got {ndt!r}",
                "Remove it to use the variant's default.",
            )
        pct = entry.get("canary_percent", default_canary_percent)
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100:
            raise _bad(
                source,
                f"{where}.canary_percent",
                f"must be between 0 and 100, got {pct!r}",
                "Use 100 to send all of the route's traffic to its variant.",
            )
        decision = entry.get("decision")
        if decision is not None and decision not in DECISIONS:
            raise _bad(
                source,
                f"{where}.decision",
                f"unknown decision {decision!r}",
                "Use one of: " + ", ".join(DECISIONS) + ".",
            )
        fallback = entry.get("fallback_variant", default)
        if not isinstance(fallback, str) or not fallback:
            raise _bad(
                source,
                f"{where}.fallback_variant",
                "must be a variant name",
                "e.g. fallback_variant: baseline",
            )
        limit = entry.get("max_concurrency")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise _bad(
                source,
                f"{where}.max_concurrency",
                f"must be a positive integer, got {limit!r}",
                "Remove it to send the route to its variant at any load.",
            )
        schedule = _schedule(source, f"{where}.draft_len_schedule", entry.get("draft_len_schedule"))
        routes[str(name)] = RouteRule(variant, ndt, float(pct), decision, fallback, limit, schedule)
    return RoutingTable(default, routes, fingerprint)


def _schedule(source: str, where: str, raw: Any) -> tuple[tuple[int, int], ...] | None:
    """``{in-flight level: draft length}`` (JSON keys arrive as strings)."""
    if raw is None:
        return None
    hint = "e.g. draft_len_schedule: {1: 4, 8: 2} (draft length 4 up to 7 in flight, then 2)"
    if not isinstance(raw, dict) or not raw:
        raise _bad(source, where, "expected a mapping of in-flight level to draft length", hint)
    pairs = []
    for level, length in raw.items():
        try:
            lvl = int(level)
        except (TypeError, ValueError):
            lvl = 0
        if isinstance(level, bool) or lvl < 1 or str(lvl) != str(level).strip():
            raise _bad(source, f"{where}.{level}", "level must be a positive integer", hint)
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise _bad(
                source,
                f"{where}.{level}",
                f"draft length must be a positive integer, got {length!r}",
                hint,
            )
        pairs.append((lvl, length))
    return tuple(sorted(pairs))


def load_routing(path: Path, *, default_canary_percent: float = 100.0) -> RoutingTable:
    """Read ``routing.yaml`` (or the ``routing.json`` the router model reads)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RepoError(
            f"{path}: cannot read the routing file: {exc.strerror}",
            "Pass an existing file with --routing.",
        ) from exc
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except (ValueError, Exception) as exc:  # yaml.YAMLError is an Exception
        raise RepoError(
            f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}",
            "Fix the syntax or regenerate it with `trtspec bench`.",
        ) from exc
    return parse_routing(data, str(path), default_canary_percent=default_canary_percent)


def routing_from_rollout(fallback_variant: str = BASELINE) -> RoutingTable:
    """Without a routing file nothing is promoted yet: every route is served
    by the rollout's fallback variant until ``trtspec bench`` writes one."""
    return RoutingTable(default_variant=fallback_variant, routes={})


def canary_bucket(request_id: str) -> int:
    """A stable bucket in [0, 10000) for ``request_id`` (hundredths of a percent)."""
    digest = hashlib.sha256(request_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 10000


def choose(table: RoutingTable, route: str | None, request_id: str) -> Choice:
    """The variant for one request: the route's variant for ``canary_percent``
    of request ids, its fallback for the rest; the default for unknown routes."""
    rule = table.routes.get(route or "")
    if rule is None:
        return Choice(table.default_variant, table.default_variant, None, canary=False)
    if canary_bucket(request_id) < round(rule.canary_percent * 100):
        return Choice(rule.variant, rule.fallback_variant, rule.num_draft_tokens, canary=True)
    return Choice(rule.fallback_variant, rule.fallback_variant, None, canary=False)


class InFlight:
    """Per-route counts of the requests a router has in flight on a route's
    variant, enforcing the route's ``max_concurrency`` (thread-safe)."""

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}  # this process's own

    @staticmethod
    def _limited(table: RoutingTable, route: str | None, choice: Choice) -> str | None:
        rule = table.routes.get(route) if route is not None else None
        if (
            rule is None
            or not choice.canary
            or (rule.max_concurrency is None and not rule.draft_len_schedule)
        ):
            return None
        return route

    @contextmanager
    def _elsewhere(self, write: bool) -> Iterator[dict[str, int]]:
        """Per route, what other router processes have in flight, for the
        time of one look (``write``: and change) at the counts, under
        ``_lock``; none here: this counter sees only its own process."""
        yield {}

    def admit(self, table: RoutingTable, route: str | None, choice: Choice) -> Choice:
        """``choice``, or its fallback while the route's variant already serves
        ``max_concurrency`` requests, with the draft length its schedule gives
        at the route's in-flight count (this request included); pass what it
        returns to ``release`` when the request ends."""
        key = self._limited(table, route, choice)
        if key is None:
            return choice
        rule = table.routes[key]
        with self._lock, self._elsewhere(write=True) as others:
            own = self._counts.get(key, 0)
            current = others.get(key, 0) + own
            if rule.max_concurrency is not None and current >= rule.max_concurrency:
                return Choice(choice.fallback_variant, choice.fallback_variant, None, canary=False)
            self._counts[key] = own + 1
        if rule.draft_len_schedule:
            return Choice(
                choice.variant, choice.fallback_variant, rule.draft_len_at(current + 1), True
            )
        return choice

    def release(self, table: RoutingTable, route: str | None, choice: Choice) -> None:
        key = self._limited(table, route, choice)
        if key is not None:
            with self._lock, self._elsewhere(write=True):
                self._counts[key] = max(0, self._counts.get(key, 0) - 1)

    def count(self, route: str) -> int:
        with self._lock, self._elsewhere(write=False) as others:
            return others.get(route, 0) + self._counts.get(route, 0)
