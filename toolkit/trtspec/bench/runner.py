"""The paired benchmark run (docs/design/decisions.md). ``run_benchmark`` takes
a ``BenchPlan`` (bench/plan.py) or a spec, applies the ``--prefix-cache``
policy (bench/parity.py), starts the server unless given ``--endpoint``, and
sends every cell (bench/cells.py: every sampled prompt to every arm with
identical sampling and seed; at a closed-loop level c, blocks of c prompts of
one arm at a time, arm order alternating per block, so slow drift cancels and a
level counts one arm's requests in flight, as routing.yaml's limits do); runs
an optional open-loop Poisson rate; excludes warmup; appends a row per
completed request; samples server memory; and renders the report.
``--isolate`` serves one arm's models at a time in its own tritonserver, in
ABBA order over two halves of the prompts. External arms (``bench.external``:
OpenAI-compatible servers) ride in the same job lists, sent by
``trtspec.bench.external.ArmWorker``."""

from __future__ import annotations

import contextlib
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts.bench_run import REQUESTS_FILE, RUN_FILE, PrefixCache, RunInfo, Summary
from trtspec.bench.cells import Run, Target, serve, wait_ready
from trtspec.bench.client import Arm, LagProbe
from trtspec.bench.parity import COLD, POLICIES, WARM, parity_repo, shared_engines
from trtspec.bench.plan import BenchPlan, BenchSettings, plan_from_spec
from trtspec.bench.progress import RouteBars
from trtspec.bench.recorder import Recorder
from trtspec.bench.records import RequestLog, atomic_write_json
from trtspec.bench.report import METRICS_FILE, render_run
from trtspec.bench.report_console import console_lines
from trtspec.bench.sequential import DEFAULT_MAX_REQUESTS
from trtspec.bench.summary import environment_info, git_commit
from trtspec.errors import BenchError, TrtspecError, os_error

if TYPE_CHECKING:
    from trtspec.spec import Spec

# re-exported: callers build a plan by hand (benchmarks/aiperf_crosscheck.py)
__all__ = ["BenchOptions", "BenchPlan", "BenchSettings", "RunResult", "run_benchmark"]


@dataclass
class RunResult:
    run_dir: Path
    summary: Summary
    console: list[str]
    interrupted: bool = False

    @property
    def error_rate(self) -> float | None:
        return self.summary["totals"]["error_rate"]


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


def client_stats(probe: LagProbe) -> dict[str, float | None]:
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
    run = Run(plan, run_dir, run_dir.name or uuid.uuid4().hex[:8], say, bars)
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
    if parity_repo_dir := parity.get("repo"):
        repo = Path(parity_repo_dir)
    run_info: RunInfo = {
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
        recorder = Recorder(log, run_id, {r.name: r for r in plan.routes}, run.stop)
        probe = LagProbe()
        try:
            with probe:
                models = sorted({a.model for a in plan.arms if a.openai is None})
                if not triton:
                    run.phase(Target("", None, None), recorder, plan.arms)
                elif endpoint:
                    run.triton_version = wait_ready(endpoint, models)
                    run.phase(Target(endpoint, metrics_url, None), recorder, plan.arms)
                elif not isolate:
                    with serve(run, repo, None, run_dir / "tritonserver.log") as target:
                        run.triton_version = wait_ready(target.url, models)
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
                run_info["server"]["footprint"] = run.server_footprint
            run_info["sequential_stops"] = run.stops
            run_info["block_repeats"] = run.block_repeats
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
        route_temperatures={r.name: r.temperatures for r in plan.routes if r.temperatures},
    )


def _cache_parity(
    plan: BenchPlan, repo: Path, run_dir: Path, endpoint: str | None, say: Callable[[str], None]
) -> PrefixCache:
    """Apply the run's --prefix-cache policy before anything is served; what
    was done goes to run.json (and summary.json)."""
    from trtspec.serve.manifest import MANIFEST_NAME, resolve_repo

    policy = plan.settings.prefix_cache
    out: PrefixCache = {"policy": policy, "repo": None, "own_engine_models": {}}
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


def _run_isolated(run: Run, plan: BenchPlan, repo: Path, recorder: Recorder) -> None:
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
                run.phase(Target("", None, None), recorder, per_variant[name], samples=half)
                continue
            models = variant_models(repo, name)
            run.progress(f"bench: --isolate: serving {name} ({', '.join(models)})")
            log_path = run.run_dir / f"tritonserver-{name}.log"
            with serve(run, repo, models, log_path) as target:
                run.triton_version = wait_ready(target.url, [per_variant[name][0].model])
                run.phase(target, recorder, per_variant[name], samples=half)
