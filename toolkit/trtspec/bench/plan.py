"""What a benchmark run measures, decided before anything is sent:
``plan_from_spec`` turns a spec (docs/design/spec.md) plus command-line
narrowing into a ``BenchPlan`` — routes with their prompts, and *arms* (the
baseline, each variant at each swept ``num_draft_tokens``, a per-request input,
so a k sweep needs no rebuild) — with the run's ``BenchSettings``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.bench.blocks import LEVEL_UNIT
from trtspec.bench.client import Arm
from trtspec.bench.external import external_arms
from trtspec.bench.parity import COLD
from trtspec.bench.quality import default_checks, validate_check_names
from trtspec.bench.routes import RouteSet, load_prompt_set
from trtspec.bench.sequential import DEFAULT_MAX_REQUESTS, SequentialPlan
from trtspec.catalogue import BASELINE, MODES
from trtspec.errors import BenchError
from trtspec.modes.draft_model import DraftModelVariant
from trtspec.spec.schema import DEFAULT_DECISION, Bench

if TYPE_CHECKING:
    from trtspec.spec import Spec, Variant

DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_MAX_INFLIGHT = 32


_SPEC_BENCH = Bench()  # the schema's defaults, the one place they are written


@dataclass
class BenchSettings:
    concurrency: list[int] = field(default_factory=lambda: list(_SPEC_BENCH.concurrency))
    request_rate: float | None = _SPEC_BENCH.request_rate
    temperatures: list[float] = field(default_factory=lambda: list(_SPEC_BENCH.temperatures))
    top_p: float = _SPEC_BENCH.top_p
    top_k: int = _SPEC_BENCH.top_k
    seed: int = _SPEC_BENCH.seed
    warmup_requests: int = _SPEC_BENCH.warmup_requests
    requests_per_route: int = _SPEC_BENCH.requests_per_route
    decision: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_DECISION))
    rollout: dict[str, Any] = field(default_factory=dict)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    # Sample until decided (bench/sequential.py); None = a fixed count per route.
    sequential: SequentialPlan | None = None
    # Cache state each arm's requests start from (bench/parity.py).
    prefix_cache: str = COLD

    def settings_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "sequential"}
        out["until_decided"] = self.sequential is not None
        out["sequential"] = self.sequential.as_dict() if self.sequential else None
        out["level_unit"] = LEVEL_UNIT
        return out

    def loads(
        self, route_levels: list[int] | None = None
    ) -> list[tuple[str, int | None, float | None]]:
        """The loads a route runs: its own closed-loop levels when it has
        them (routes.<name>.concurrency), else the run's; then open loop."""
        out: list[tuple[str, int | None, float | None]] = [
            (f"concurrency={c}", c, None) for c in (route_levels or self.concurrency)
        ]
        if self.request_rate is not None:
            out.append((f"rate={self.request_rate:g}/s", None, self.request_rate))
        return out


@dataclass
class BenchPlan:
    spec_name: str
    spec_hash: str | None
    spec_path: str | None
    routes: list[RouteSet]
    arms: list[Arm]
    settings: BenchSettings
    tokenizer_dir: Path | None = None


def _pick(names: list[str] | None, known: list[str], what: str) -> list[str]:
    if not names:
        return known
    for n in names:
        if n not in known:
            raise BenchError(
                f"--{what}s: unknown {what} {n!r}", hint=f"{what}s in the spec: " + ", ".join(known)
            )
    return [n for n in known if n in names]


def arms_for(
    variants: Sequence[Variant], ks: list[int] | None = None, *, per_request_k: bool = True
) -> list[Arm]:
    """The baseline and every variant × k (k only for modes that take a
    per-request ``num_draft_tokens``, and only in a flow that has one:
    ``per_request_k``)."""
    if ks and not per_request_k:
        raise BenchError(
            "--num-draft-tokens: this spec's serving flow fixes the draft length per model",
            hint="set the variant's max_draft_len and rebuild (`trtspec build`, `trtspec repo`)",
        )
    arms = [Arm(BASELINE, BASELINE)]
    for v in variants:
        mode, name = v.mode, v.name
        draft = v.draft.model if isinstance(v, DraftModelVariant) else None
        if per_request_k and MODES[mode].k_sweepable:
            sweep = ks or getattr(v, "num_draft_tokens", None) or [v.max_draft_len]
            limit = v.max_draft_len
            for k in sweep:
                if limit is not None and int(k) > int(limit):
                    raise BenchError(
                        f"--num-draft-tokens: {k} exceeds variant {name!r} max_draft_len {limit}",
                        hint="sweep values up to the engine's max_draft_len (no rebuild needed)",
                    )
                arms.append(Arm(name, name, mode, True, draft, int(k)))
        else:
            arms.append(Arm(name, name, mode, True, None, None))
    return arms


def plan_from_spec(
    spec: Spec,
    *,
    variants: list[str] | None = None,
    routes: list[str] | None = None,
    concurrency: list[int] | None = None,
    request_rate: float | None = None,
    temperatures: list[float] | None = None,
    num_draft_tokens: list[int] | None = None,
    requests: int | None = None,
    warmup_requests: int | None = None,
    tokenizer: Path | None = None,
    engines_root: Path = Path("engines"),
    external: list[str] | None = None,
    external_only: bool = False,
    until_decided: bool = False,
    max_requests: int = DEFAULT_MAX_REQUESTS,
) -> BenchPlan:
    """Everything the run needs from a ``trtspec.spec.Spec``. ``external``
    narrows the spec's external (OpenAI-compatible) arms, ``[]`` drops them;
    ``external_only`` drops the Triton arms. ``until_decided`` (ignored when
    ``requests`` fixes a count) samples each cell until its speedup is decided
    or ``max_requests`` pairs were sent."""
    bench, spec_routes = spec.bench, spec.routes
    if not spec_routes:
        raise BenchError(
            f"{spec.source_path}: routes: the spec defines no routes",
            hint="add a `routes:` section pointing at build_specs/routes/*.jsonl",
        )
    all_variants = list(spec.variants)
    chosen_v = _pick(variants, [v.name for v in all_variants], "variant")
    chosen_r = _pick(routes, list(spec_routes), "route")
    settings = BenchSettings(
        concurrency=list(concurrency or bench.concurrency),
        request_rate=request_rate if request_rate is not None else bench.request_rate,
        temperatures=[float(t) for t in (temperatures or bench.temperatures)],
        top_p=float(bench.top_p),
        top_k=int(bench.top_k),
        seed=int(bench.seed),
        warmup_requests=warmup_requests if warmup_requests is not None else bench.warmup_requests,
        requests_per_route=int(requests or bench.requests_per_route),
        decision=bench.decision.model_dump(mode="json"),
        rollout=spec.rollout.model_dump(mode="json"),
    )
    if until_decided and requests is None:
        min_pairs = int(bench.decision.min_pairs)
        settings.sequential = SequentialPlan(
            first=min(min_pairs, max_requests), batch=min_pairs, maximum=max_requests
        )
    route_sets = []
    for name in chosen_r:
        r = spec_routes[name]
        path = spec.resolve_path(r.prompts)
        items = load_prompt_set(path)
        checks = list(r.checks) or default_checks(items)
        validate_check_names(checks, f"routes.{name}.checks")
        # --concurrency overrides every route's own levels
        levels = None if concurrency else r.concurrency
        temps = None if temperatures or r.temperatures is None else list(r.temperatures)
        route_sets.append(
            RouteSet(name, path, items, r.max_tokens, checks, requests or r.requests, levels, temps)
        )
    spec_name = spec.name
    tok = tokenizer or spec.tokenizer_dir(engines_root)
    arms = (
        []
        if external_only
        else arms_for(
            [v for v in all_variants if v.name in chosen_v],
            num_draft_tokens,
            per_request_k=spec.flow.per_request_draft_len,
        )
    )
    arms += external_arms(bench.external, external) if external != [] else []
    if not arms:
        raise BenchError(
            "--external-only: the spec defines no external arms",
            hint="add bench.external to the spec, or leave out --external-only",
        )
    return BenchPlan(
        spec_name=spec_name,
        spec_hash=spec.spec_hash,
        spec_path=str(spec.source_path) if spec.source_path else None,
        routes=route_sets,
        arms=arms,
        settings=settings,
        tokenizer_dir=tok,
    )
