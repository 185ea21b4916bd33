"""Sending a run's cells (route × load × temperature) to a server: the jobs
of each cell in their order (bench/blocks.py: at a closed-loop level c, blocks
of c prompts of one arm at a time, arm order alternating per block), warmup
first, fixed count or until decided (bench/until.py), recovery from stub
crashes through the run's watchdog, and the server memory sampled after each
cell."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.artifacts.bench_run import BlockRepeat, SequentialStop
from trtspec.bench.blocks import cell_order, repeats_in_block, whole_blocks
from trtspec.bench.client import Arm, Job, Outcome, poisson_schedule, run_blocks
from trtspec.bench.external import ExternalArms
from trtspec.bench.parity import WARM
from trtspec.bench.plan import BenchPlan
from trtspec.bench.progress import RouteBars
from trtspec.bench.recorder import Recorder
from trtspec.bench.records import RequestLog
from trtspec.bench.routes import RouteSet, load_tokenizer, render_prompt
from trtspec.bench.sequential import SequentialPlan
from trtspec.bench.until import Block, run_block
from trtspec.catalogue import BASELINE
from trtspec.errors import BenchError
from trtspec.runtime.limits import request_seed
from trtspec.serve.watchdog import Incident, StubWatchdog

# A repository with one engine model per arm (--prefix-cache cold) loads more
# stubs; on a busy machine 120 s was not enough (`trtspec serve` waits 300 s).
SERVER_START_TIMEOUT_S = 300.0


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
class Target:
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


class Run:
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
        self.stops: list[SequentialStop] = []  # where each until-decided arm stopped
        # routes × levels whose blocks repeat a prompt (fewer prompts than the level)
        self.block_repeats: list[BlockRepeat] = []

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
        self, target: Target, on_done: Callable[[Outcome], None]
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
                if any(m in error for m in _UNREACHABLE) and not server_live(target.url):
                    outcome.incident = "server_unreachable"
                    self.abort(f"the server at {target.url} stopped answering ({error})")
                elif "is not healthy" in error:  # a dead stub on a server not ours
                    outcome.incident = "stub_unresponsive"
                return False
            watchdog.check()  # waits for a restart in progress; finds a crash now
            found = watchdog.incidents_since(outcome.send_ns)
            unreachable = any(m in error for m in _UNREACHABLE)
            if not found and unreachable:
                if not server_live(target.url):
                    found = _exit_in_progress(watchdog, outcome.send_ns)
                elif watchdog.incidents:
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
    ) -> list[list[Job]]:
        """The cell's jobs as blocks in sending order (bench/blocks.py). A
        measured fixed count at a closed-loop level is whole blocks."""
        s = self.plan.settings
        label, conc, rate = load
        n = count or (
            s.warmup_requests
            if warmup
            else whole_blocks(route.requests or s.requests_per_route, conc)
        )
        picked = {i: item for i, item in route.sample(n) if samples is None or i in samples}
        blocks = []
        for order in cell_order(list(picked), arms, conc):
            jobs = []
            for sample_index, arm in order:
                item = picked[sample_index]
                prompt_index = sample_index % len(route.items)
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
            blocks.append(jobs)
        return blocks

    def phase(
        self,
        target: Target,
        recorder: Recorder,
        arms: list[Arm],
        samples: list[int] | None = None,
    ) -> None:
        s = self.plan.settings
        for route in self.plan.routes:
            for load in s.loads(route.concurrency):
                self._check_repeats(route, load)
                for temp in route.temperatures or s.temperatures:
                    if self.stop.is_set():
                        return
                    label, conc, _rate = load
                    warm = self._jobs(route, arms, load, temp, samples=None, warmup=True)
                    make_worker = self.external.worker_factory(target.url, s.request_timeout_s)
                    if warm:
                        run_blocks(
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
                            blocks = self._jobs(
                                route, arms, load, temp, samples=samples, warmup=False
                            )
                            self.progress(
                                f"bench: route={route.name} {label} T={temp:g} "
                                f"{sum(map(len, blocks))} requests over {len(arms)} arm(s)"
                            )
                            self._send(target, recorder, blocks, load, make_worker=make_worker)
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

    def _check_repeats(self, route: RouteSet, load: tuple[str, int | None, float | None]) -> None:
        """Warn (once per route and level) when a block must send a prompt
        twice: the second copy may find the first's KV blocks on one arm and
        not on another (bench/blocks.py). Not under ``--prefix-cache warm``,
        where every measured request finds its prompt primed."""
        label, conc, _rate = load
        key: BlockRepeat = {"route": route.name, "load": label, "prompts": len(route.items)}
        if (
            not repeats_in_block(len(route.items), conc)
            or self.plan.settings.prefix_cache == WARM  # every request is primed alike
            or key in self.block_repeats
        ):
            return
        self.block_repeats.append(key)
        self.progress(
            f"bench: warning: route={route.name} {label}: {len(route.items)} prompt(s) for "
            f"blocks of {conc}, so a block sends a prompt twice and its arms may start from "
            "different cache states (the report lists any prompt whose prefix_reused_tokens "
            "differ); give the route at least as many prompts as its highest level"
        )

    def _send(
        self,
        target: Target,
        recorder: Recorder,
        blocks: list[list[Job]],
        load: tuple[str, int | None, float | None],
        *,
        also: Callable[[Outcome], None] | None = None,
        make_worker: Callable[[], Any] | None = None,
    ) -> None:
        s = self.plan.settings
        _label, conc, rate = load
        count = sum(map(len, blocks))
        schedule = poisson_schedule(count, rate, s.seed) if rate else None

        def done(out: Outcome) -> None:
            if also is not None:
                also(out)
            recorder.put(out)

        run_blocks(
            target.url,
            blocks,
            workers=conc or min(s.max_inflight, max(1, count)),
            on_done=done,
            stop=self.stop,
            request_timeout_s=s.request_timeout_s,
            schedule_s=schedule,
            recover=self.recovery(target, recorder.put),
            make_worker=make_worker,
        )

    def _until_decided(
        self,
        target: Target,
        recorder: Recorder,
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
        plan = plan.capped(route.requests)  # a route's own requests cap its pairs
        label, level, _rate = load
        maximum = plan.sizes_at(level)[-1]
        variants = [a for a in arms if a.variant != BASELINE]
        base = next((a for a in arms if a.variant == BASELINE), None)
        if base is None or not variants:
            blocks = self._jobs(
                route, arms, load, temperature, samples=None, warmup=False, count=maximum
            )
            self._send(target, recorder, blocks, load, make_worker=make_worker)
            return
        self.progress(
            f"bench: route={route.name} {label} T={temperature:g} up to "
            f"{maximum} pairs per arm over {len(arms)} arm(s), until decided"
        )
        self.bars.route(f"{route.name} {label} T={temperature:g}", maximum, len(variants))
        block = Block()

        def send(now: list[Arm], samples: range) -> None:
            blocks = self._jobs(
                route, now, load, temperature, samples=samples, warmup=False, count=maximum
            )
            self._send(target, recorder, blocks, load, also=block.record, make_worker=make_worker)

        stops = run_block(
            plan,
            [base, *variants],
            float(self.plan.settings.decision["min_speedup"]),
            send=send,
            block=block,
            stopped=self.stop.is_set,
            on_batch=self.bars.update,
            level=level,
        )
        if stops and max(st.pairs for st in stops) < maximum:
            self.bars.finish_early()
        self.bars.close()
        self.stops.extend(st.as_dict(route.name, label, temperature) for st in stops)


def wait_ready(url: str, models: list[str], timeout_s: float = 30.0) -> str | None:
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


def _exit_in_progress(watchdog: StubWatchdog, send_ns: int, wait_s: float = 2.0) -> list[Incident]:
    """The incidents of a server that is dying as we look. A process killed
    outright has its sockets closed by the kernel before it turns into a
    zombie that ``poll`` can see, so a client may meet the dropped connection
    a moment before the exit shows (on a busy host, long enough to call it a
    stub that stopped answering instead). Give the exit that moment."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        found = watchdog.incidents_since(send_ns)
        if found:
            return found
        if watchdog.server.poll() is not None:
            watchdog.check()
            return watchdog.incidents_since(send_ns)
        time.sleep(0.05)
    return []


def server_live(url: str) -> bool:
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
def serve(run: Run, repo: Path, models: list[str] | None, log_path: Path) -> Iterator[Target]:
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
    from trtspec.serve.footprint import SERVING, Footprint, Memory, MemorySampler, group_memory

    # the group of whichever server runs now (a restart starts a new one),
    # from the start (the engine stubs' load is their peak) to the stop
    sampler = MemorySampler(lambda: group_memory(server.pid) if server.pid else Memory())
    ready_s: float | None = None
    try:
        sampler.start()
        started = time.monotonic()
        server.start(timeout=SERVER_START_TIMEOUT_S)
        ready_s = time.monotonic() - started
        sampler.set_phase(SERVING)  # an engine stub's load and its requests peak apart
        run.progress(f"bench: tritonserver ready in {ready_s:.1f} s")
        with StubWatchdog(server, on_incident=said).prime() as watchdog:
            yield Target(server.grpc_url, server.metrics_url, server.pid, watchdog)
    finally:
        peak = sampler.stop()
        stopping = time.monotonic()
        server.stop()
        if ready_s is not None:
            footprint = Footprint(
                ready_s,
                peak,
                time.monotonic() - stopping,
                at_peak=sampler.at_peak,
                phases=dict(sampler.at_peak_of),
            )
            run.server_footprint = footprint.to_json()
            for line in footprint.lines():
                run.progress(f"bench: tritonserver {line}")
