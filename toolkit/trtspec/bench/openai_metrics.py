"""Acceptance of external arms from their servers' Prometheus counters, since
OpenAI responses carry none.

The counters per runtime, read from each runtime's source (the names are
facts; keep them here and nowhere else):

- **vLLM** (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``; labels
  ``model_name``, ``engine`` from ``vllm/v1/metrics/loggers.py``): counters
  ``vllm:spec_decode_num_drafts``, ``…_num_draft_tokens``,
  ``…_num_accepted_tokens`` and ``…_num_accepted_tokens_per_pos{position}``,
  exposed with prometheus_client's ``_total`` suffix. vLLM's own formulas:
  acceptance rate = accepted / draft tokens; mean acceptance length =
  1 + accepted / drafts.
- **trtllm-serve** (``tensorrt_llm/metrics/collector.py``, ``MetricsCollector``;
  served on ``/prometheus/metrics`` only when the LLM API option
  ``return_perf_metrics`` is on — its ``/metrics`` route returns JSON
  iteration stats and drains them): counters
  ``trtllm_spec_decode_num_draft_tokens_total``,
  ``trtllm_spec_decode_num_accepted_tokens_total`` and per position
  ``trtllm_spec_decode_accepted_tokens_total{token_position}``; no count of
  drafts, so no mean acceptance length from deltas. Older releases (the 1.1
  series) expose no spec-decode counters at all. The counters come from
  iteration stats, which the server polls only when its LLM arguments set
  ``enable_iter_perf_stats: true`` as well as ``return_perf_metrics: true``
  (``tensorrt_llm/serve/openai_server.py`` at 00057725, the lifespan's
  "background iteration stats collector"); without it the page carries the
  per-request ``trtllm_`` metrics and no spec-decode sample, which is said
  as such (``TRTLLM_NO_ITER_STATS``), not as "no speculation".
- **SGLang** (``python/sglang/srt/metrics/collector.py``): only the gauges
  ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate``, a running
  average over recent batches; a gauge has no delta over a run window, so
  acceptance is recorded as unknown rather than estimated.

Counters are server-wide: a delta is exact only when nothing else talks to
that server in the window. At concurrency 1 the window is one request (its
row carries the counts); otherwise it is one cell (route × arm × load ×
temperature), recorded in ``metrics.jsonl`` and attached to the cell by
``attach_cell_acceptance``."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from trtspec.artifacts.bench_run import Cell, JSONObject

ACCEPTANCE_FROM_METRICS = "metrics"
SETTLE_S = 0.05  # counters may be updated just after the last chunk is sent
SETTLE_MAX_S = 1.0


@dataclass(frozen=True)
class SpecCounters:
    """Names of one runtime's speculative-decoding counters."""

    runtime: str
    draft_tokens: str
    accepted_tokens: str
    drafts: str | None
    per_position: str | None
    position_label: str
    source: str


PROFILES = (
    SpecCounters(
        "vllm",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "position",
        "vllm/v1/spec_decode/metrics.py SpecDecodingProm",
    ),
    SpecCounters(
        "trtllm-serve",
        "trtllm_spec_decode_num_draft_tokens_total",
        "trtllm_spec_decode_num_accepted_tokens_total",
        None,
        "trtllm_spec_decode_accepted_tokens_total",
        "token_position",
        "tensorrt_llm/metrics/collector.py MetricsCollector",
    ),
)
GAUGE_ONLY = {
    "sglang:spec_accept_length": (
        "SGLang exposes only the gauges sglang:spec_accept_length/spec_accept_rate (a running "
        "average, not counters), so no per-run delta exists"
    ),
    "trtllm_spec_decode_acceptance_length": (
        "trtllm-serve exposes only the gauge trtllm_spec_decode_acceptance_length here, "
        "no draft/accepted counters"
    ),
}

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) for every sample line of a Prometheus text page."""
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        labels = dict(_LABEL.findall(m["labels"] or ""))
        out.append((m["name"], labels, value))
    return out


def scrape(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        ctype = resp.headers.get("Content-Type", "")
        text: str = resp.read().decode("utf-8", errors="replace")
    if "json" in ctype or text.lstrip().startswith(("[", "{")):
        raise ValueError(
            "returns JSON, not Prometheus text (trtllm-serve's /metrics holds "
            "iteration stats; its Prometheus page is /prometheus/metrics)"
        )
    return text


#: Why a trtllm-serve page with its per-request metrics has no spec-decode counters.
TRTLLM_NO_ITER_STATS = (
    "trtllm-serve publishes its spec-decode counters from iteration stats, which it "
    "collects only with enable_iter_perf_stats: true (and return_perf_metrics: true) in its "
    "--config; trtspec's generated LLM-API files set both, so check the server's config"
)
#: Per-request metrics every trtllm-serve with return_perf_metrics publishes.
TRTLLM_REQUEST_METRICS = ("trtllm_request_success_total", "trtllm_e2e_request_latency_seconds")


def detect(text: str) -> tuple[SpecCounters | None, str | None]:
    """The runtime whose spec-decode counters the page holds, or why none."""
    names = {name for name, _, _ in parse_prometheus(text)}
    for profile in PROFILES:
        if profile.draft_tokens in names and profile.accepted_tokens in names:
            return profile, None
    for name, reason in GAUGE_ONLY.items():
        if name in names:
            return None, reason
    if any(n.startswith(TRTLLM_REQUEST_METRICS) for n in names) and not any(
        n.startswith("trtllm_spec_decode_") for n in names
    ):
        return None, TRTLLM_NO_ITER_STATS
    return None, (
        "no speculative-decoding counters on the metrics page (vllm:spec_decode_*, "
        "trtllm_spec_decode_*); the server may not run speculative decoding"
    )


@dataclass
class Counts:
    draft_tokens: float
    accepted_tokens: float
    drafts: float | None
    per_position: dict[int, float]

    def minus(self, other: Counts) -> Counts:
        return Counts(
            self.draft_tokens - other.draft_tokens,
            self.accepted_tokens - other.accepted_tokens,
            None if self.drafts is None or other.drafts is None else self.drafts - other.drafts,
            {p: v - other.per_position.get(p, 0.0) for p, v in self.per_position.items()},
        )


def counts(text: str, profile: SpecCounters, model: str | None = None) -> Counts:
    """Summed counters of one page; series labelled with another model are
    left out when some series carries ``model_name=model``."""
    samples = parse_prometheus(text)
    if model is not None and any(lab.get("model_name") == model for _, lab, _ in samples):
        samples = [s for s in samples if s[1].get("model_name", model) == model]

    def total(name: str | None) -> float | None:
        if name is None:
            return None
        vals = [v for n, _, v in samples if n == name]
        return sum(vals) if vals else 0.0

    per_pos: dict[int, float] = {}
    for name, labels, value in samples:
        if name == profile.per_position and labels.get(profile.position_label, "").isdigit():
            pos = int(labels[profile.position_label])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    return Counts(
        total(profile.draft_tokens) or 0.0,
        total(profile.accepted_tokens) or 0.0,
        total(profile.drafts),
        per_pos,
    )


class MetricsProbe:
    """Snapshots of one server's counters, for deltas around a window."""

    def __init__(self, url: str, profile: SpecCounters, model: str | None) -> None:
        self.url, self.profile, self.model = url, profile, model

    def snapshot(self) -> Counts:
        return counts(scrape(self.url), self.profile, self.model)

    def settled(self) -> Counts:
        """A snapshot taken once the counters stop moving (a server may add the
        last step's counts just after sending the last chunk)."""
        now = self.snapshot()
        deadline = time.monotonic() + SETTLE_MAX_S
        while time.monotonic() < deadline:
            time.sleep(SETTLE_S)
            again = self.snapshot()
            if again == now:
                break
            now = again
        return now


class AcceptanceFields(TypedDict, total=False):
    """Row (or cell) fields from a counter delta; None where unknown (a
    request at concurrency > 1 carries only the source and the note)."""

    draft_tokens: int | None
    accepted_tokens: int | None
    rounds: int | None
    accepted_per_position: dict[str, int] | None
    acceptance_source: str | None
    acceptance_note: str | None


class AcceptanceSample(TypedDict):
    """A ``metrics.jsonl`` line holding one cell's counter delta."""

    spec_decode: AcceptanceFields
    route: str
    load: str
    temperature: float
    variant: str
    time: float


#: Run after a request: its acceptance fields (ExternalArms.scrape_for).
Scrape = Callable[[], AcceptanceFields]


def acceptance_fields(delta: Counts | None, reason: str | None = None) -> AcceptanceFields:
    """Row/cell fields from a counter delta (``None`` = unknown, with ``reason``)."""
    if delta is None or delta.draft_tokens < 0 or delta.accepted_tokens < 0:
        return {
            "draft_tokens": None,
            "accepted_tokens": None,
            "rounds": None,
            "acceptance_source": None,
            "acceptance_note": reason or "a counter went backwards (server restarted?)",
        }
    return {
        "draft_tokens": round(delta.draft_tokens),
        "accepted_tokens": round(delta.accepted_tokens),
        # a vLLM "draft" is one verification step that carried a draft
        "rounds": None if delta.drafts is None else round(delta.drafts),
        "accepted_per_position": {str(p): round(v) for p, v in sorted(delta.per_position.items())},
        "acceptance_source": ACCEPTANCE_FROM_METRICS,
        "acceptance_note": None,
    }


def cell_sample(
    route: str, load: str, temperature: float, variant: str, fields: AcceptanceFields
) -> AcceptanceSample:
    """A ``metrics.jsonl`` line holding one cell's counter delta."""
    return {
        "spec_decode": fields,
        "route": route,
        "load": load,
        "temperature": temperature,
        "variant": variant,
        "time": time.time(),
    }


def attach_cell_acceptance(cells: list[Cell], samples: list[JSONObject]) -> None:
    """Give external speculative cells measured above concurrency 1 the counter
    delta of their window; say why where none exists."""
    for cell in cells:
        if cell.get("arm_kind") != "openai" or not cell.get("speculative"):
            continue
        if cell.get("acceptance_source") == ACCEPTANCE_FROM_METRICS:
            continue  # per-request deltas already summed from the rows
        mine = [
            s["spec_decode"]
            for s in samples
            if "spec_decode" in s
            and s.get("route") == cell["route"]
            and str(s.get("load")) == cell["load"]
            and s.get("variant") == cell["variant"]
            and float(s.get("temperature") or 0.0) == cell["temperature"]
        ]
        if not mine:
            continue
        last = mine[-1]
        if last.get("acceptance_source") != ACCEPTANCE_FROM_METRICS:
            cell["acceptance_note"] = last.get("acceptance_note")
            continue
        drafted, accepted, rounds = (
            last["draft_tokens"],
            last["accepted_tokens"],
            last.get("rounds"),
        )
        cell.update(
            {
                "draft_tokens": drafted,
                "accepted_tokens": accepted,
                "rounds": rounds or 0,
                "acceptance_source": ACCEPTANCE_FROM_METRICS,
                "acceptance_note": "one delta over the whole cell (concurrency > 1)",
                "acceptance_rate": accepted / drafted if drafted else None,
                "mean_accepted_length": (1.0 + accepted / rounds) if rounds else None,
            }
        )
