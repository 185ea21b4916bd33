"""``--fail-on`` gates: parsing ``"speedup<1.0@code_completion,error_rate>0.01"``
into conditions and checking them against the summary's cells. A gate states
the *failing* condition; a run breaches it when any matching cell satisfies it.
``@route`` (optionally ``@route/variant``) narrows a gate; without it the gate
applies to every cell that has the metric."""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

from trtspec.bench.metrics import METRICS as CELL_METRICS
from trtspec.errors import BenchError

# metric name -> how to read it from one summary cell (trtspec.bench.metrics)
METRICS: dict[str, Callable[[Mapping[str, Any]], float | None]] = {
    m.name: m.read for m in CELL_METRICS
}

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    ">=": operator.ge,
    "<": operator.lt,
    ">": operator.gt,
}
_GATE = re.compile(
    r"^\s*(?P<metric>[a-z_0-9]+)\s*(?P<op><=|>=|<|>)\s*(?P<value>[-+0-9.eE]+)\s*"
    r"(?:@\s*(?P<route>[A-Za-z0-9_.-]+)(?:/(?P<variant>[A-Za-z0-9_.-]+))?)?\s*$"
)
_HINT = (
    "write gates as METRIC<VALUE[@ROUTE[/VARIANT]], comma-separated, e.g. "
    '--fail-on "speedup<1.0@code_completion,error_rate>0.01"'
)


@dataclass(frozen=True)
class Gate:
    metric: str
    op: str
    value: float
    route: str | None = None
    variant: str | None = None

    def __str__(self) -> str:
        where = f"@{self.route}" if self.route else ""
        if self.variant:
            where += f"/{self.variant}"
        return f"{self.metric}{self.op}{self.value:g}{where}"


@dataclass(frozen=True)
class Breach:
    gate: Gate
    route: str
    variant: str
    cell: str
    observed: float

    def __str__(self) -> str:
        return (
            f"{self.gate}: {self.gate.metric}={self.observed:.4g} "
            f"at route={self.route} variant={self.variant} ({self.cell})"
        )


def parse_gates(
    text: str | None, metrics: Mapping[str, Callable[[Mapping[str, Any]], float | None]] = METRICS
) -> list[Gate]:
    """Parse a ``--fail-on`` value; raise ``BenchError`` naming the bad part.
    ``metrics`` is the set of names allowed (``trtspec compare`` has its own)."""
    if text is None or not text.strip():
        return []
    gates = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _GATE.match(part)
        if not m:
            raise BenchError(f"--fail-on: cannot parse {part.strip()!r}", hint=_HINT)
        metric = m["metric"]
        if metric not in metrics:
            close = get_close_matches(metric, list(metrics), n=1)
            hint = (f"did you mean {close[0]!r}? " if close else "") + (
                "known metrics: " + ", ".join(sorted(metrics))
            )
            raise BenchError(f"--fail-on: unknown metric {metric!r} in {part.strip()!r}", hint=hint)
        try:
            value = float(m["value"])
        except ValueError:
            raise BenchError(
                f"--fail-on: {m['value']!r} is not a number in {part.strip()!r}", hint=_HINT
            ) from None
        gates.append(Gate(metric, m["op"], value, m["route"], m["variant"]))
    return gates


def cell_label(cell: Mapping[str, Any]) -> str:
    k = cell.get("num_speculative_tokens")
    parts = [str(cell.get("load")), f"T={cell.get('temperature')}"]
    if k is not None:
        parts.append(f"k={k}")
    return " ".join(parts)


def check_gates(
    gates: list[Gate],
    cells: Sequence[Mapping[str, Any]],
    metrics: Mapping[str, Callable[[Mapping[str, Any]], float | None]] = METRICS,
) -> list[Breach]:
    """Every breach of every gate. A gate naming a route (or variant) that is
    not in the run is an error rather than a silent pass."""
    breaches: list[Breach] = []
    routes = {c["route"] for c in cells}
    variants = {c["variant"] for c in cells}
    for gate in gates:
        if gate.route is not None and gate.route not in routes:
            raise BenchError(
                f"--fail-on: {gate} names route {gate.route!r}, which this run did not bench",
                hint="routes in this run: " + ", ".join(sorted(routes)),
            )
        if gate.variant is not None and gate.variant not in variants:
            raise BenchError(
                f"--fail-on: {gate} names variant {gate.variant!r}, which this run did not bench",
                hint="variants in this run: " + ", ".join(sorted(variants)),
            )
        read = metrics[gate.metric]
        for cell in cells:
            if gate.route is not None and cell["route"] != gate.route:
                continue
            if gate.variant is not None and cell["variant"] != gate.variant:
                continue
            observed = read(cell)
            if observed is None:
                continue
            if _OPS[gate.op](float(observed), gate.value):
                breaches.append(
                    Breach(gate, cell["route"], cell["variant"], cell_label(cell), float(observed))
                )
    return breaches
