"""The per-cell metrics of a benchmark, declared once: each entry is a name,
its unit, what it measures and how it is computed (``trtspec.bench.summary``
computes it from the rows of ``requests.jsonl``) and where it sits in a
``summary.json`` cell. ``--fail-on`` gates (``trtspec.bench.gates``) and
``trtspec compare`` read cells through these entries, so a metric's name and
location are written here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    name: str  # the name gates and comparisons use
    unit: str  # "ratio" (a fraction or a multiple), "ms", "tokens", "tokens/s"
    computed: str  # how summary.py computes it from the rows
    key: str  # the summary cell's key
    part: str | None = None  # the statistic inside a distribution (p50, p95, mean, point…)

    def read(self, cell: Mapping[str, Any]) -> float | None:
        """This metric of one summary cell (None where the cell has none)."""
        value: Any = cell.get(self.key)
        if self.part is not None:
            value = (value or {}).get(self.part)
        return value  # as summary.json holds it


def _dist(name: str, key: str, part: str, unit: str, what: str) -> Metric:
    return Metric(name, unit, f"{part} over the cell's successful requests of {what}", key, part)


METRICS: tuple[Metric, ...] = (
    Metric(
        "speedup",
        "ratio",
        "geometric mean over paired prompts of baseline/variant ms per output token",
        "speedup",
        "point",
    ),
    Metric(
        "speedup_ci_low",
        "ratio",
        "lower end of the speedup's t interval on the log ratios",
        "speedup",
        "ci_low",
    ),
    Metric("error_rate", "ratio", "failed requests / requests", "error_rate"),
    Metric(
        "equal_rate",
        "ratio",
        "paired prompts whose text equals the baseline's / pairs both answered",
        "equal_rate",
    ),
    Metric(
        "quality_pass_rate",
        "ratio",
        "requests passing the route's quality check / requests judged",
        "quality_pass_rate",
    ),
    Metric("acceptance_rate", "ratio", "Σaccepted / Σdrafted", "acceptance_rate"),
    Metric(
        "mean_accepted_length",
        "tokens",
        "(Σaccepted + Σrounds) / Σrounds: tokens committed per verification round",
        "mean_accepted_length",
    ),
    Metric(
        "tokens_per_second",
        "tokens/s",
        "mean over requests of completion tokens / end-to-end seconds",
        "tokens_per_second",
        "mean",
    ),
    _dist("ttft_p50_ms", "ttft_ms", "p50", "ms", "the time to the first non-empty text delta"),
    _dist("ttft_p95_ms", "ttft_ms", "p95", "ms", "the time to the first non-empty text delta"),
    _dist("latency_p50_ms", "latency_ms", "p50", "ms", "the end-to-end latency"),
    _dist("latency_p95_ms", "latency_ms", "p95", "ms", "the end-to-end latency"),
    _dist("tpot_p50_ms", "tpot_ms", "p50", "ms", "(E2E − TTFT) / (completion_tokens − 1)"),
    _dist("tpot_p95_ms", "tpot_ms", "p95", "ms", "(E2E − TTFT) / (completion_tokens − 1)"),
    Metric(
        "p95_latency_regression",
        "ratio",
        "variant p95 latency / baseline p95 latency − 1",
        "p95_latency_regression",
    ),
)

BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
