"""The paired benchmark run. ``plan_from_spec`` turns a spec (docs/internals.md
§1) plus command-line narrowing into a ``BenchPlan``: routes with their
prompts, and *arms* (the baseline, each variant at each swept
``num_draft_tokens`` — a per-request input, so a k sweep needs no rebuild).
``run_benchmark`` sends every sampled prompt to every arm with identical
sampling and seed, alternating arm order per prompt (A B C, C B A …) so slow
drift cancels; runs closed-loop concurrency levels and an optional open-loop
Poisson rate; excludes warmup; appends a row per completed request; samples
server memory; and renders the report. ``--isolate`` serves one arm's models
at a time in its own tritonserver, in ABBA order over two halves of the
prompts. External arms (``bench.external``: OpenAI-compatible servers) ride in
the same job lists, sent by ``trtspec.bench.external.ArmWorker``."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.bench.client import Arm, Job, LagProbe, Outcome, poisson_schedule, run_jobs
from trtspec.bench.external import ExternalArms, external_arms
from trtspec.bench.parity import COLD, POLICIES, WARM, parity_repo, shared_engines
from trtspec.bench.progress import RouteBars
from trtspec.bench.quality import QualityRunner, default_checks, validate_check_names
from trtspec.bench.records import (
    ACCEPTANCE_NOT_REPORTED,
    REQUEST_SCHEMA_VERSION,
    REQUESTS_FILE,
    RUN_FILE,
    RequestLog,
    atomic_write_json,
    ids_hash,
    text_hash,
)
from trtspec.bench.report import METRICS_FILE, console_lines, render_run
from trtspec.bench.routes import RouteSet, load_prompt_set, load_tokenizer, render_prompt
from trtspec.bench.sequential import DEFAULT_MAX_REQUESTS, SequentialPlan
from trtspec.bench.summary import environment_info, git_commit
from trtspec.bench.until import Block, run_block
from trtspec.catalogue import BASELINE, MODES
from trtspec.errors import BenchError, TrtspecError, os_error
from trtspec.flows import flow_for
from trtspec.limits import request_seed
from trtspec.modes.draft_model import DraftModelVariant
from trtspec.serve.watchdog import Incident, StubWatchdog
from trtspec.spec.schema import DEFAULT_DECISION, Bench

if TYPE_CHECKING:
    from trtspec.spec import Spec, Variant

DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_MAX_INFLIGHT = 32
# A repository with one engine model per arm (--prefix-cache cold) loads more
# stubs; on a busy machine 120 s was not enough (`trtspec serve` waits 300 s).
SERVER_START_TIMEOUT_S = 300.0


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


@dataclass
class RunResult:
    run_dir: Path
    summary: dict[str, Any]
    console: list[str]
    interrupted: bool = False

    @property
    def error_rate(self) -> float | None:
        return self.summary["totals"]["error_rate"]


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
        route_sets.append(
            RouteSet(name, path, items, r.max_tokens, checks, requests or r.requests, levels)
        )
    spec_name = spec.name
    tok = tokenizer or flow_for(spec).tokenizer_dir(spec, engines_root)
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


# -- server memory --------------------------------------------------------------------------


def _tree_rss(pid: int) -> int | None:
    """RSS of ``pid`` and its descendants (Triton's Python backend runs one
    stub process per model instance)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))
            rss[int(entry.name)] = int(fields[21]) * page
        except (OSError, ValueError, IndexError):
            continue
    if pid not in rss:
        return None
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


_METRIC_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def server_memory(metrics_url: str | None, pid: int | None) -> tuple[int | None, str | None]:
    """(bytes, kind): GPU memory used from Triton's metrics endpoint when it
    reports any, else the server process tree's RSS when we started it, else
    the host memory in use that Triton reports."""
    sums: dict[str, float] = {}
    if metrics_url:
        url = metrics_url if "://" in metrics_url else f"http://{metrics_url}"
        url = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode("utf-8", "replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            m = _METRIC_LINE.match(line)
            if m and m["name"] in ("nv_gpu_memory_used_bytes", "nv_cpu_memory_used_bytes"):
                with contextlib.suppress(ValueError):
                    sums[m["name"]] = sums.get(m["name"], 0.0) + float(m["value"])
    if sums.get("nv_gpu_memory_used_bytes"):
        return int(sums["nv_gpu_memory_used_bytes"]), "gpu"
    if pid is not None:
        rss = _tree_rss(pid)
        if rss is not None:
            return rss, "process_rss"
    if "nv_cpu_memory_used_bytes" in sums:
        return int(sums["nv_cpu_memory_used_bytes"]), "host_used"
    return None, None


# -- the run --------------------------------------------------------------------------------


@dataclass
class _Target:
    url: str
    metrics_url: str | None
    pid: int | None
    # The stub watchdog of a server this run started: it notices a dead stub
    # or server and restarts it on the same ports (None for --endpoint:
    # somebody else's server is not ours to restart).
    watchdog: StubWatchdog | None = None

    @property
    def server_pid(self) -> int | None:
        return self.watchdog.server.pid if self.watchdog is not None else self.pid


# Errors after which a server this run owns is restarted (through its
# watchdog) even when no stub died: a stub that stopped answering, a server
# that stopped accepting requests. Under --endpoint the unreachable ones end
# the run as incomplete.
_RECOVERABLE = ("is not healthy", "timeout: no final response")
_UNREACHABLE = (
    "UNAVAILABLE",
    "Socket closed",
    "Connection refused",
    "failed to connect",
    "Stream removed",
    "Broken pipe",
    "Connection reset",
)


class _Recorder:
    """Turns outcomes into rows on one background thread (quality checks
    included) so workers go straight back to sending."""

    def __init__(
        self,
        log: RequestLog,
        run_id: str,
        routes: dict[str, RouteSet],
        stop: threading.Event | None = None,
    ) -> None:
        self.log, self.run_id, self.routes = log, run_id, routes
        self.quality = QualityRunner()
        self._queue: queue.Queue[Outcome | None] = queue.Queue()
        self._seq = 0
        # A row that cannot be written (full disk) stops the run through `stop`
        # and is raised by close(); later outcomes are dropped, not half-written.
        self._stop = stop
        self.error: OSError | None = None
        self._thread = threading.Thread(target=self._loop, name="trtspec-recorder", daemon=True)
        self._thread.start()

    def put(self, outcome: Outcome) -> None:
        self._queue.put(outcome)

    def _loop(self) -> None:
        while True:
            out = self._queue.get()
            if out is None:
                return
            if out.error == "interrupted" or self.error is not None:
                continue  # cut short by Ctrl-C, or nowhere to write: not a result
            try:
                self.log.append(self.row(out, self._seq + 1))
            except OSError as exc:
                self.error = exc
                if self._stop is not None:
                    self._stop.set()
                continue
            self._seq += 1

    def close(self) -> None:
        """Record what is queued (``error`` then says whether a write failed)."""
        self._queue.put(None)
        self._thread.join()

    def row(self, out: Outcome, seq: int) -> dict[str, Any]:
        job, f = out.job, out.final
        latency = (out.end_ns - out.send_ns) / 1e6 if out.end_ns else None
        ttft = (out.first_text_ns - out.send_ns) / 1e6 if out.first_text_ns else None
        n = f.get("completion_tokens")
        if n is None and not out.error:
            n = len(out.ids)
        tpot = (
            (latency - ttft) / (n - 1)
            if latency is not None and ttft is not None and n and n > 1
            else None
        )
        tps = n / (latency / 1e3) if n and latency else None
        route = self.routes[job.route]
        quality = (
            self.quality.run(route.checks, out.text, job.item, job.prompt_index)
            if not out.error and route.checks
            else {}
        )

        def ns_ms(v):
            return None if v is None else v / 1e6

        arm = job.arm
        pairs_with = arm.baseline if arm.openai else (None if arm.variant == BASELINE else BASELINE)
        # a served variant that leaves its draft/accepted counts out (the LLM-API
        # flow at versions whose llmapi model zeroes them): not available, never 0
        unreported = (
            arm.speculative and not arm.openai and not out.error and f.get("draft_tokens") is None
        )
        return {
            "schema_version": REQUEST_SCHEMA_VERSION,
            "run_id": self.run_id,
            "seq": seq,
            "warmup": job.warmup,
            "route": job.route,
            "prompt_index": job.prompt_index,
            "sample_index": job.sample_index,
            "variant": job.arm.variant,
            "model": job.arm.model,
            "mode": job.arm.mode,
            "speculative": job.arm.speculative,
            "draft_model": job.arm.draft_model,
            "num_speculative_tokens": job.arm.k,
            "temperature": job.temperature,
            "top_p": job.top_p,
            "top_k": job.top_k,
            "seed": job.seed,
            "max_tokens": job.max_tokens,
            "load": job.load,
            "concurrency": job.concurrency,
            "request_rate": job.request_rate,
            "request_id": job.request_id,
            "send_time_unix": out.send_time_unix,
            "prompt_tokens": f.get("prompt_tokens"),
            "completion_tokens": n,
            "ttft_ms": ttft,
            "latency_ms": latency,
            "tpot_ms": tpot,
            "tokens_per_second": tps,
            "accepted_tokens": f.get("accepted_tokens"),
            "draft_tokens": f.get("draft_tokens"),
            "rounds": f.get("rounds"),
            "server_ttft_ms": ns_ms(f.get("server_ttft_ns")),
            "prefix_reused_tokens": _reused(f.get("prefix_reused_tokens")),
            "server_total_ms": ns_ms(f.get("server_total_ns")),
            "served_variant": f.get("variant"),
            "fallback": f.get("fallback"),
            "error": out.error,
            "incident": out.incident,
            "text_hash": text_hash(out.text),
            # OpenAI streams carry text, not token ids
            "output_ids_hash": None if arm.openai else ids_hash(out.ids),
            # at T > 0 the first token is a draw from the target's distribution
            # for this prompt (bench/distribution.py compares the arms')
            "first_token": out.ids[0] if out.ids and not arm.openai else None,
            "output_text": out.text,
            "quality": quality,
            "client_overhead_ms": out.overhead_ns / 1e6,
            "client_overhead_wall_ms": out.overhead_wall_ns / 1e6,
            "send_lag_ms": None if out.send_lag_ns is None else out.send_lag_ns / 1e6,
            "responses": out.responses,
            "arm_kind": "openai" if arm.openai else "triton",
            "pairs_with": pairs_with,
            "acceptance_source": f.get(
                "acceptance_source",
                "response" if arm.speculative and not arm.openai and not unreported else None,
            ),
            "acceptance_note": f.get(
                "acceptance_note", ACCEPTANCE_NOT_REPORTED if unreported else None
            ),
            "accepted_per_position": f.get("accepted_per_position"),
            "drafted_per_position": f.get("drafted_per_position"),
            "finish_reason": f.get("finish_reason"),
        }


def _reused(value: int | None) -> int | None:
    # the orchestrator sends -1 when its engine reports no perf metrics
    return None if value is None or value < 0 else int(value)


def _abba(arms: list[Arm], sample_index: int) -> list[Arm]:
    return arms if sample_index % 2 == 0 else list(reversed(arms))


class _Run:
    def __init__(
        self,
        plan: BenchPlan,
        run_dir: Path,
        run_id: str,
        progress: Callable[[str], None],
        bars: RouteBars | None = None,
    ) -> None:
        self.plan, self.run_dir, self.run_id, self.progress = plan, run_dir, run_id, progress
        self.stop = threading.Event()
        self.tokenizer = None
        triton = any(a.openai is None for a in plan.arms)
        if triton and any(it.get("messages") for r in plan.routes for it in r.items):
            self.tokenizer = load_tokenizer(plan.tokenizer_dir)
        # external arms send `messages` as they are (the server renders them)
        self.texts = {
            (r.name, i): (
                render_prompt(it, self.tokenizer) if triton or it.get("prompt") is not None else ""
            )
            for r in plan.routes
            for i, it in enumerate(r.items)
        }
        self.external = ExternalArms(plan.arms)
        self._counter = 0
        self.memory: RequestLog | None = None  # opened once the run folder exists
        self.triton_version: str | None = None
        # the server this run started: ready time, peak memory, stop time (serve/footprint.py)
        self.server_footprint: dict[str, Any] | None = None
        self.incidents: list[dict[str, Any]] = []
        self._incident_rows: dict[int, dict[str, Any]] = {}
        self.incomplete_reason: str | None = None
        self._lock = threading.Lock()
        self.bars = bars or RouteBars.off()
        self.stops: list[dict[str, Any]] = []  # where each until-decided arm stopped

    def abort(self, reason: str) -> None:
        """Stop the run; what completed stays, marked incomplete."""
        with self._lock:
            if self.incomplete_reason is None:
                self.incomplete_reason = reason
                self.progress(f"bench: {reason}; stopping with partial results")
        self.stop.set()

    def _incident(self, incident: Incident, outcome: Outcome | None) -> dict[str, Any]:
        with self._lock:
            entry = self._incident_rows.get(id(incident))
            if entry is None:
                entry = {
                    **incident.as_dict(),
                    "error": incident.message(),
                    "model": incident.model or (outcome.job.arm.model if outcome else None),
                    "route": outcome.job.route if outcome else None,
                    "request_id": outcome.job.request_id if outcome else None,
                    "requests_failed": 0,
                }
                self._incident_rows[id(incident)] = entry
                self.incidents.append(entry)
            if outcome is not None:
                entry["requests_failed"] += 1
                if entry["route"] is None:
                    entry.update(
                        model=entry["model"] or outcome.job.arm.model,
                        route=outcome.job.route,
                        request_id=outcome.job.request_id,
                    )
            return entry

    def recovery(
        self, target: _Target, on_done: Callable[[Outcome], None]
    ) -> Callable[[Outcome], bool]:
        """A ``recover`` hook for run_jobs. A failure the infrastructure caused
        (a stub crash, a dead or silent server) is recorded as an error row
        marked ``incident`` — it counts in ``error_rate`` and the decision —
        and, when this run owns the server, the request is sent again once the
        watchdog has it serving; under ``--endpoint`` a server that stopped
        answering ends the run as incomplete."""

        def recover(outcome: Outcome) -> bool:
            error = outcome.error or ""
            if outcome.job.arm.openai is not None:
                return False  # an external server is not ours: its failures are its own
            watchdog = target.watchdog
            if watchdog is None:
                if any(m in error for m in _UNREACHABLE) and not _server_live(target.url):
                    outcome.incident = "server_unreachable"
                    self.abort(f"the server at {target.url} stopped answering ({error})")
                elif "is not healthy" in error:  # a dead stub on a server not ours
                    outcome.incident = "stub_unresponsive"
                return False
            watchdog.check()  # waits for a restart in progress; finds a crash now
            found = watchdog.incidents_since(outcome.send_ns)
            unreachable = any(m in error for m in _UNREACHABLE)
            if not found and unreachable and watchdog.incidents and _server_live(target.url):
                # A connection that still carried the last restart (gRPC's
                # reconnect backoff) to a server that is back: that incident's.
                found = [watchdog.incidents[-1]]
            if not found and (unreachable or any(m in error for m in _RECOVERABLE)):
                found = [
                    watchdog.note(
                        Incident(
                            "stub_unresponsive",
                            outcome.job.arm.model,
                            None,
                            f"stopped answering ({error})",
                        )
                    )
                ]
            if not found:
                return False
            incident = found[0]
            entry = self._incident(incident, outcome)
            outcome.incident = incident.kind
            outcome.error = f"{entry['error']} ({error}); {incident.action or 'no recovery'}"
            if not incident.recovered:
                self.abort(f"{entry['error']}; {incident.action}: {incident.error}")
                return False
            on_done(outcome)  # the failed attempt is a row (an error) of its own
            return True

        return recover

    def _jobs(
        self,
        route: RouteSet,
        arms: list[Arm],
        load: tuple[str, int | None, float | None],
        temperature: float,
        *,
        samples: list[int] | range | None,
        warmup: bool,
        count: int | None = None,
    ) -> list[Job]:
        s = self.plan.settings
        label, conc, rate = load
        n = count or (s.warmup_requests if warmup else (route.requests or s.requests_per_route))
        jobs = []
        for sample_index, item in route.sample(n):
            if samples is not None and sample_index not in samples:
                continue
            prompt_index = sample_index % len(route.items)
            for arm in _abba(arms, sample_index):
                self._counter += 1
                jobs.append(
                    Job(
                        route=route.name,
                        prompt_index=prompt_index,
                        sample_index=sample_index,
                        item=item,
                        text_input=self.texts[(route.name, prompt_index)],
                        max_tokens=int(item.get("max_tokens") or route.max_tokens),
                        arm=arm,
                        temperature=temperature,
                        top_p=s.top_p,
                        top_k=s.top_k,
                        seed=request_seed(s.seed, sample_index),
                        load=label,
                        concurrency=conc,
                        request_rate=rate,
                        warmup=warmup,
                        prime=s.prefix_cache == WARM and not warmup,
                        request_id=f"{self.run_id}-{'w' if warmup else 'm'}{self._counter}",
                    )
                )
        return jobs

    def phase(
        self,
        target: _Target,
        recorder: _Recorder,
        arms: list[Arm],
        samples: list[int] | None = None,
    ) -> None:
        s = self.plan.settings
        for route in self.plan.routes:
            for load in s.loads(route.concurrency):
                for temp in s.temperatures:
                    if self.stop.is_set():
                        return
                    label, conc, _rate = load
                    warm = self._jobs(route, arms, load, temp, samples=None, warmup=True)
                    make_worker = self.external.worker_factory(target.url, s.request_timeout_s)
                    if warm:
                        run_jobs(
                            target.url,
                            warm,
                            workers=conc or 1,
                            on_done=recorder.put,
                            stop=self.stop,
                            request_timeout_s=s.request_timeout_s,
                            recover=self.recovery(target, recorder.put),
                            make_worker=make_worker,
                        )
                    assert self.memory is not None
                    with self.external.cell_window(
                        route.name, label, conc, temp, arms, record=self.memory.append
                    ):
                        # External arms pair with their own baselines: they
                        # keep a fixed count (bench/until.py pairs with one).
                        if s.sequential is not None and samples is None and not self.external:
                            self._until_decided(
                                target,
                                recorder,
                                route,
                                arms,
                                load,
                                temperature=temp,
                                plan=s.sequential,
                                make_worker=make_worker,
                            )
                        else:
                            jobs = self._jobs(
                                route, arms, load, temp, samples=samples, warmup=False
                            )
                            self.progress(
                                f"bench: route={route.name} {label} T={temp:g} "
                                f"{len(jobs)} requests over {len(arms)} arm(s)"
                            )
                            self._send(target, recorder, jobs, load, make_worker=make_worker)
                    mem, kind = server_memory(target.metrics_url, target.server_pid)
                    self.memory.append(
                        {
                            "route": route.name,
                            "load": label,
                            "temperature": temp,
                            "variants": sorted({a.variant for a in arms}),
                            "bytes": mem,
                            "kind": kind,
                            "time": time.time(),
                        }
                    )

    def _send(
        self,
        target: _Target,
        recorder: _Recorder,
        jobs: list[Job],
        load: tuple[str, int | None, float | None],
        *,
        also: Callable[[Outcome], None] | None = None,
        make_worker: Callable[[], Any] | None = None,
    ) -> None:
        s = self.plan.settings
        _label, conc, rate = load
        schedule = poisson_schedule(len(jobs), rate, s.seed) if rate else None

        def done(out: Outcome) -> None:
            if also is not None:
                also(out)
            recorder.put(out)

        run_jobs(
            target.url,
            jobs,
            workers=conc or min(s.max_inflight, max(1, len(jobs))),
            on_done=done,
            stop=self.stop,
            request_timeout_s=s.request_timeout_s,
            schedule_s=schedule,
            recover=self.recovery(target, recorder.put),
            make_worker=make_worker,
        )

    def _until_decided(
        self,
        target: _Target,
        recorder: _Recorder,
        route: RouteSet,
        arms: list[Arm],
        load: tuple[str, int | None, float | None],
        *,
        temperature: float,
        plan: SequentialPlan,
        make_worker: Callable[[], Any] | None = None,
    ) -> None:
        """Batches of pairs until every variant arm of this block is decided
        (bench/until.py); where each stopped goes to run.json."""
        label = load[0]
        variants = [a for a in arms if a.variant != BASELINE]
        base = next((a for a in arms if a.variant == BASELINE), None)
        if base is None or not variants:
            jobs = self._jobs(
                route, arms, load, temperature, samples=None, warmup=False, count=plan.maximum
            )
            self._send(target, recorder, jobs, load, make_worker=make_worker)
            return
        self.progress(
            f"bench: route={route.name} {label} T={temperature:g} up to "
            f"{plan.maximum} pairs per arm over {len(arms)} arm(s), until decided"
        )
        self.bars.route(f"{route.name} {label} T={temperature:g}", plan.maximum, len(variants))
        block = Block()

        def send(now: list[Arm], samples: range) -> None:
            jobs = self._jobs(
                route, now, load, temperature, samples=samples, warmup=False, count=plan.maximum
            )
            self._send(target, recorder, jobs, load, also=block.record, make_worker=make_worker)

        stops = run_block(
            plan,
            [base, *variants],
            float(self.plan.settings.decision["min_speedup"]),
            send=send,
            block=block,
            stopped=self.stop.is_set,
            on_batch=self.bars.update,
        )
        if stops and max(st.pairs for st in stops) < plan.maximum:
            self.bars.finish_early()
        self.bars.close()
        self.stops.extend(st.as_dict(route.name, label, temperature) for st in stops)


def _wait_ready(url: str, models: list[str], timeout_s: float = 30.0) -> str | None:
    """Wait until every model is ready; return the server's Triton version."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                missing = [m for m in models if not client.is_model_ready(m)]
                if not missing:
                    return str(client.get_server_metadata().version)
                problem = "not ready: " + ", ".join(missing)
            except InferenceServerException as exc:
                problem = f"unreachable ({exc.message() if hasattr(exc, 'message') else exc})"
            if time.monotonic() > deadline:
                raise BenchError(
                    f"server at {url}: {problem}",
                    hint="start it with `trtspec serve SPEC` (all variants) or "
                    "let `trtspec bench` start it by leaving out --endpoint",
                )
            time.sleep(0.5)
    finally:
        client.close()


def _server_live(url: str) -> bool:
    import tritonclient.grpc as grpcclient

    try:
        client = grpcclient.InferenceServerClient(url)
    except Exception:  # any failure to connect means "not live"
        return False
    try:
        return bool(client.is_server_live(client_timeout=5.0))
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            client.close()


@contextlib.contextmanager
def _serve(run: _Run, repo: Path, models: list[str] | None, log_path: Path) -> Iterator[_Target]:
    """A server this run owns, under a stub watchdog that restarts it on the
    same ports when a stub or the server dies (the log continues)."""
    from trtspec.serve import Server

    def said(incident: Incident) -> None:
        run.progress(
            f"bench: {incident.message()}; {incident.action}"
            + (f" in {incident.recovery_s:.1f} s" if incident.recovery_s else "")
        )
        run._incident(incident, None)

    from trtspec.serve.access import root_warning

    server = Server(repo, models=models, log_path=log_path)
    warning = root_warning()
    if warning:
        run.progress(f"bench: {warning}")
    from trtspec.serve.footprint import Footprint, Memory, MemorySampler, group_memory

    # the group of whichever server runs now (a restart starts a new one),
    # from the start (the engine stubs' load is their peak) to the stop
    sampler = MemorySampler(lambda: group_memory(server.pid) if server.pid else Memory())
    ready_s: float | None = None
    try:
        sampler.start()
        started = time.monotonic()
        server.start(timeout=SERVER_START_TIMEOUT_S)
        ready_s = time.monotonic() - started
        run.progress(f"bench: tritonserver ready in {ready_s:.1f} s")
        with StubWatchdog(server, on_incident=said).prime() as watchdog:
            yield _Target(server.grpc_url, server.metrics_url, server.pid, watchdog)
    finally:
        peak = sampler.stop()
        stopping = time.monotonic()
        server.stop()
        if ready_s is not None:
            footprint = Footprint(ready_s, peak, time.monotonic() - stopping)
            run.server_footprint = footprint.to_json()
            for line in footprint.lines():
                run.progress(f"bench: tritonserver {line}")


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT both stop the run the way Ctrl-C does (completed rows
    kept, the report rendered, the server torn down). SIGINT is installed
    explicitly, as `trtspec serve` does: a shell without job control starts
    background jobs with SIGINT ignored, and `kill -INT` must still stop us."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous_term = signal.signal(signal.SIGTERM, handler)
    previous_int = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)


def client_stats(probe: LagProbe) -> dict[str, Any]:
    return probe.summary()


@dataclass(frozen=True)
class BenchOptions:
    """What one ``trtspec bench`` run was asked for (``cli/bench.py`` builds it
    from its flags). ``None`` means "the spec's value" (``bench.*`` in the
    spec, whose schema holds every default)."""

    output_dir: Path  # the run folder
    endpoint: str | None = None  # a running server; None = serve ``repo`` here
    metrics_url: str | None = None
    repo: Path | None = None  # None = triton_repo/<spec name>
    variants: list[str] | None = None
    routes: list[str] | None = None
    concurrency: list[int] | None = None
    request_rate: float | None = None
    temperatures: list[float] | None = None
    num_draft_tokens: list[int] | None = None
    requests: int | None = None  # a fixed count per route (overrides until_decided)
    warmup_requests: int | None = None
    isolate: bool = False  # one server per variant
    tokenizer: Path | None = None
    engines_root: Path = Path("engines")
    request_timeout_s: float | None = None
    plots: bool = True
    external: list[str] | None = None  # narrow the external arms; [] drops them
    external_only: bool = False
    until_decided: bool = False
    max_requests: int = DEFAULT_MAX_REQUESTS
    prefix_cache: str = COLD


def run_benchmark(
    spec: Spec | BenchPlan,
    options: BenchOptions,
    *,
    progress: Callable[[str], None] | None = None,
    bars: RouteBars | None = None,
) -> RunResult:
    """Bench ``spec`` (a ``Spec`` or a ready ``BenchPlan``) into
    ``options.output_dir`` (the run folder). Without ``options.endpoint`` it
    serves ``options.repo`` (default ``triton_repo/<spec name>``) itself.
    Ctrl-C/SIGTERM stop the load, keep every completed request, render what is
    there and re-raise."""
    o = options
    plan = (
        spec
        if isinstance(spec, BenchPlan)
        else plan_from_spec(
            spec,
            variants=o.variants,
            routes=o.routes,
            concurrency=o.concurrency,
            request_rate=o.request_rate,
            temperatures=o.temperatures,
            num_draft_tokens=o.num_draft_tokens,
            requests=o.requests,
            warmup_requests=o.warmup_requests,
            tokenizer=o.tokenizer,
            engines_root=o.engines_root,
            external=o.external,
            external_only=o.external_only,
            until_decided=o.until_decided and not o.isolate,
            max_requests=o.max_requests,
        )
    )
    endpoint, metrics_url, repo, isolate = o.endpoint, o.metrics_url, o.repo, o.isolate
    engines_root, request_timeout_s, prefix_cache = (
        o.engines_root,
        o.request_timeout_s,
        o.prefix_cache,
    )
    if request_timeout_s is not None:
        plan.settings.request_timeout_s = request_timeout_s
    if prefix_cache not in POLICIES:
        raise BenchError(
            f"--prefix-cache: unknown policy {prefix_cache!r}",
            hint="use one of: " + ", ".join(POLICIES),
        )
    plan.settings.prefix_cache = prefix_cache
    say = progress or (lambda _m: None)
    triton = any(a.openai is None for a in plan.arms)
    if isolate and endpoint:
        raise BenchError(
            "--isolate starts one server per variant and cannot use --endpoint",
            hint="leave out --endpoint, or leave out --isolate",
        )
    run_dir = Path(o.output_dir)
    # prompts are rendered (tokenizer loaded) before anything is written
    run = _Run(plan, run_dir, run_dir.name or uuid.uuid4().hex[:8], say, bars)
    if (run_dir / REQUESTS_FILE).exists():
        raise BenchError(
            f"{run_dir}: already holds a run ({REQUESTS_FILE} exists)",
            hint="choose a new --run-dir, or delete the old run first",
        )
    if run.external:
        run.external.check_ready(say)
    run_dir.mkdir(parents=True, exist_ok=True)
    say(f"bench: writing {run_dir}")
    run_id = run.run_id
    repo = repo or Path("triton_repo") / plan.spec_name
    parity = _cache_parity(plan, repo, run_dir, endpoint, say)
    if parity.get("repo"):
        repo = Path(parity["repo"])
    run_info: dict[str, Any] = {
        "run_id": run_id,
        "git_commit": git_commit(Path(__file__).parent),
        "spec": {"name": plan.spec_name, "hash": plan.spec_hash, "path": plan.spec_path},
        **environment_info(),
        "server": {
            "endpoint": endpoint if triton else None,
            "repo": None if endpoint or not triton else str(repo),
            "isolate": isolate,
        },
        "external": run.external.info(
            [r.name for r in plan.routes if any(it.get("messages") for it in r.items)]
        ),
        "prefix_cache": parity,
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "complete": False,
        "settings": {
            **plan.settings.settings_dict(),
            "routes": {
                r.name: {
                    "prompts": str(r.path),
                    "max_tokens": r.max_tokens,
                    "checks": r.checks,
                    "requests": r.requests,
                }
                for r in plan.routes
            },
            "arms": [a.label for a in plan.arms],
        },
    }
    run_info["fingerprint"] = _fingerprint(
        spec, plan, engines_root, None if endpoint else repo, say
    )
    atomic_write_json(run_dir / RUN_FILE, run_info)
    run.memory = RequestLog(run_dir / METRICS_FILE)
    interrupted = False
    with RequestLog(run_dir / REQUESTS_FILE) as log, _signals_as_interrupt():
        recorder = _Recorder(log, run_id, {r.name: r for r in plan.routes}, run.stop)
        probe = LagProbe()
        try:
            with probe:
                models = sorted({a.model for a in plan.arms if a.openai is None})
                if not triton:
                    run.phase(_Target("", None, None), recorder, plan.arms)
                elif endpoint:
                    run.triton_version = _wait_ready(endpoint, models)
                    run.phase(_Target(endpoint, metrics_url, None), recorder, plan.arms)
                elif not isolate:
                    with _serve(run, repo, None, run_dir / "tritonserver.log") as target:
                        run.triton_version = _wait_ready(target.url, models)
                        run.phase(target, recorder, plan.arms)
                else:
                    _run_isolated(run, plan, repo, recorder)
        except KeyboardInterrupt:
            interrupted = True
            run.stop.set()
            say("bench: interrupted; keeping the completed requests")
        finally:
            recorder.close()
            run.memory.close()
            run_info["client"] = client_stats(probe)
            run_info["versions"]["tritonserver"] = run.triton_version
            if run_info["fingerprint"]:
                run_info["fingerprint"]["versions"]["tritonserver"] = run.triton_version
            run_info["incidents"] = list(run.incidents)
            if run.server_footprint is not None:
                run_info["server"] = run.server_footprint
            run_info["sequential_stops"] = run.stops
            run.bars.close()
            run_info["finished"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
            run_info["complete"] = (
                not interrupted and recorder.error is None and run.incomplete_reason is None
            )
            run_info["incomplete_reason"] = run.incomplete_reason
            try:
                atomic_write_json(run_dir / RUN_FILE, run_info)
            except OSError:
                if recorder.error is None:
                    raise  # else the first run.json (complete: false) stays, whole
    if recorder.error is not None:
        raise _write_failed(recorder.error, log.count, run_dir / REQUESTS_FILE)
    if log.count == 0:
        if interrupted:
            raise KeyboardInterrupt
        raise BenchError(f"{run_dir}: no request completed", hint="check the server log")
    summary = render_run(run_dir, plots=o.plots)
    result = RunResult(run_dir, summary, console_lines(summary), interrupted)
    if interrupted:
        raise KeyboardInterrupt
    return result


def _write_failed(exc: OSError, count: int, path: Path) -> BenchError:
    """The error for a run stopped because a request row could not be written."""
    known = os_error(exc)
    head = known.message if known else f"{exc.filename}: {exc.strerror}"
    return BenchError(
        f"{head}; the run stopped, and the {count} requests recorded before stay in {path}",
        hint=known.hint if known else None,
    )


def _fingerprint(
    spec: Any,
    plan: BenchPlan,
    engines_root: Path,
    repo: Path | None,
    say: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any] | None:
    """What this run measures (trtspec.fingerprint); ``None`` for a ready
    ``BenchPlan``, which carries no spec to identify."""
    from trtspec.spec import Spec

    if not isinstance(spec, Spec):
        return None
    try:
        return _measure(spec, plan, engines_root, repo)
    except TrtspecError as exc:
        # the run itself does not depend on it; its routing.yaml then carries
        # none and `trtspec repo --routing` says it cannot check staleness
        say(f"bench: warning: no fingerprint recorded: {exc}")
        return None


def _measure(spec: Any, plan: BenchPlan, engines_root: Path, repo: Path | None) -> dict[str, Any]:
    from trtspec import fingerprint

    s = plan.settings
    sampling = {
        "temperatures": list(s.temperatures),
        "top_p": s.top_p,
        "top_k": s.top_k,
        "seed": s.seed,
    }
    return fingerprint.measure(
        spec,
        engines_root,
        routes={r.name: (r.path, r.max_tokens) for r in plan.routes},
        sampling=sampling,
        tokenizer_dir=plan.tokenizer_dir,
        repository=repo,
    )


def _cache_parity(
    plan: BenchPlan, repo: Path, run_dir: Path, endpoint: str | None, say: Callable[[str], None]
) -> dict[str, Any]:
    """Apply the run's --prefix-cache policy before anything is served; what
    was done goes to run.json (and summary.json)."""
    from trtspec.serve.manifest import MANIFEST_NAME, resolve_repo

    policy = plan.settings.prefix_cache
    out: dict[str, Any] = {"policy": policy, "repo": None, "own_engine_models": {}}
    if not any(a.openai is None for a in plan.arms):
        out["enforced"] = False  # external arms only: their servers are not ours
        return out
    if policy != COLD:
        out["enforced"] = policy == WARM
        return out
    if endpoint:
        out["enforced"] = False
        say(
            "bench: --prefix-cache cold cannot give arms their own engine models on a server "
            "trtspec did not start; prefix_reused_tokens in the report shows any difference"
        )
        return out
    source = resolve_repo(repo) if repo.is_dir() else repo
    if not (source / MANIFEST_NAME).is_file():
        out["enforced"] = False
        return out  # the server start reports the missing repository
    shared = shared_engines(source, plan.arms)
    out["enforced"] = True
    if not shared:
        return out
    dest = run_dir / "parity_repo"
    arms = parity_repo(source, plan.arms, dest)
    out["repo"] = str(dest)
    out["own_engine_models"] = {
        a.label: a.model for a, b in zip(arms, plan.arms, strict=True) if a.model != b.model
    }
    say(
        "bench: --prefix-cache cold: "
        + "; ".join(
            f"{engine} is shared by {', '.join(labels)}" for engine, labels in shared.items()
        )
        + f" — serving a copy with one engine model per arm ({dest})"
    )
    plan.arms = arms
    return out


def _run_isolated(run: _Run, plan: BenchPlan, repo: Path, recorder: _Recorder) -> None:
    from trtspec.serve import variant_models

    per_variant: dict[str, list[Arm]] = {}
    for arm in plan.arms:
        per_variant.setdefault(arm.variant, []).append(arm)
    names = list(per_variant)
    n = max((r.requests or plan.settings.requests_per_route) for r in plan.routes)
    halves = [list(range(0, (n + 1) // 2)), list(range((n + 1) // 2, n))]
    for half, order in ((halves[0], names), (halves[1], list(reversed(names)))):
        for name in order:
            if run.stop.is_set() or not half:
                continue
            if per_variant[name][0].openai is not None:  # an external server: always up
                run.progress(f"bench: --isolate: external arm {name}")
                run.phase(_Target("", None, None), recorder, per_variant[name], samples=half)
                continue
            models = variant_models(repo, name)
            run.progress(f"bench: --isolate: serving {name} ({', '.join(models)})")
            log_path = run.run_dir / f"tritonserver-{name}.log"
            with _serve(run, repo, models, log_path) as target:
                run.triton_version = _wait_ready(target.url, [per_variant[name][0].model])
                run.phase(target, recorder, per_variant[name], samples=half)
