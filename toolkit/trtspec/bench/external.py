"""External arms in a benchmark run: servers trtspec did not build (vLLM,
trtllm-serve, SGLang, Triton's OpenAI frontend) driven over the OpenAI API on
the same routes, prompts, sampling, seeds, warmup, ABBA order and loads as the
Triton arms.

``external_arms`` turns the spec's ``bench.external`` section into ``Arm``s
(an arm with ``baseline: other`` is speculative and pairs with that arm, its
server's target-only twin; an arm without one is a baseline). ``ExternalArms``
holds what a run needs about them: readiness (``GET /v1/models`` lists the
model), which spec-decode counters each speculative arm's metrics page has
(``openai_metrics``), the per-request counter deltas at concurrency 1, the
per-cell deltas above it, and the workers: ``ArmWorker`` sends each job to
the Triton stream or the OpenAI server its arm names, so one job list keeps
every arm of a prompt side by side."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from trtspec.artifacts.bench_run import External, ExternalArm
from trtspec.bench.client import Arm, Job, Outcome, StreamWorker
from trtspec.bench.openai_client import OpenAIEndpoint, OpenAIWorker, base_url, list_models
from trtspec.bench.openai_metrics import (
    AcceptanceFields,
    AcceptanceSample,
    Counts,
    MetricsProbe,
    Scrape,
    acceptance_fields,
    cell_sample,
    detect,
    scrape,
)
from trtspec.errors import BenchError

EXTERNAL_MODE = "external"
READY_TIMEOUT_S = 30.0


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def metrics_url_of(arm_spec: Any) -> str:
    explicit = _get(arm_spec, "metrics")
    return str(explicit) if explicit else base_url(str(_get(arm_spec, "openai"))) + "/metrics"


def external_arms(section: dict[str, Any] | None, names: list[str] | None = None) -> list[Arm]:
    """Arms for ``bench.external`` (narrowed to ``names``; a chosen arm's
    baseline comes along). Baselines first, in spec order."""
    section = dict(section or {})
    if names is not None:
        unknown = [n for n in names if n not in section]
        if unknown:
            raise BenchError(
                f"--external: no external arm named {unknown[0]!r}",
                hint="external arms in the spec: " + (", ".join(section) or "none"),
            )
        keep = set(names)
        keep |= {str(_get(section[n], "baseline")) for n in names if _get(section[n], "baseline")}
        section = {n: a for n, a in section.items() if n in keep}
    arms: list[Arm] = []
    for name, spec in section.items():
        pair = _get(spec, "baseline")
        endpoint = OpenAIEndpoint(
            url=base_url(str(_get(spec, "openai"))),
            model=str(_get(spec, "model")),
            metrics_url=metrics_url_of(spec) if pair else None,
            api_key_env=_get(spec, "api_key_env"),
        )
        arms.append(
            Arm(
                name,
                endpoint.model,
                EXTERNAL_MODE if pair else "none",
                bool(pair),
                None,
                None,
                openai=endpoint,
                baseline=str(pair) if pair else None,
            )
        )
    return sorted(arms, key=lambda a: a.speculative)


class ArmWorker:
    """A run_jobs worker that sends Triton arms' jobs over one gRPC stream
    (created on first use) and each external server's jobs over its own
    keep-alive HTTP connection."""

    def __init__(
        self,
        triton_url: str,
        request_timeout_s: float,
        scrape_for: Callable[[Job], Scrape | None],
    ) -> None:
        self.triton_url, self.request_timeout_s = triton_url, request_timeout_s
        self.scrape_for = scrape_for
        self._triton: StreamWorker | None = None
        self._openai: dict[str, OpenAIWorker] = {}

    def run(self, job: Job, stop: threading.Event | None = None) -> Outcome:
        endpoint = job.arm.openai
        if endpoint is None:
            if self._triton is None:
                self._triton = StreamWorker(self.triton_url, self.request_timeout_s)
            return self._triton.run(job, stop)
        worker = self._openai.get(endpoint.url)
        if worker is None:
            worker = self._openai[endpoint.url] = OpenAIWorker(
                endpoint, self.request_timeout_s, self.scrape_for
            )
        return worker.run(job, stop)

    def reconnect(self) -> None:
        if self._triton is not None:
            self._triton.reconnect()
        for worker in self._openai.values():
            worker.reconnect()

    def close(self) -> None:
        if self._triton is not None:
            self._triton.close()
        for worker in self._openai.values():
            worker.close()


class ExternalArms:
    """The external arms of one run and their metrics probes."""

    def __init__(self, arms: list[Arm]) -> None:
        self.arms = [a for a in arms if a.openai is not None]
        self.probes: dict[str, MetricsProbe] = {}
        self.notes: dict[str, str] = {}  # arm -> why acceptance is unknown
        self.models: dict[str, list[str]] = {}

    def __bool__(self) -> bool:
        return bool(self.arms)

    def check_ready(
        self, progress: Callable[[str], None], timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        """Every arm's server lists its model; find each speculative arm's
        spec-decode counters (or the reason there are none)."""
        import time

        for arm in self.arms:
            ep = arm.openai
            assert ep is not None
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    served = list_models(ep.url, api_key_env=ep.api_key_env)
                    break
                except (OSError, ValueError) as exc:
                    if time.monotonic() > deadline:
                        raise BenchError(
                            f"external arm {arm.variant!r}: {ep.url}/v1/models: "
                            f"{getattr(exc, 'reason', None) or exc}",
                            hint="start the OpenAI-compatible server first (vllm serve …, "
                            "trtllm-serve …) or fix bench.external."
                            f"{arm.variant}.openai",
                        ) from None
                    time.sleep(0.5)
            self.models[arm.variant] = served
            if ep.model not in served:
                raise BenchError(
                    f"external arm {arm.variant!r}: {ep.url} does not serve model {ep.model!r}",
                    hint="set bench.external."
                    + arm.variant
                    + ".model to one of: "
                    + (", ".join(served) or "(none listed)"),
                )
            if arm.speculative and ep.metrics_url:
                self._probe(arm, ep, progress)

    def _probe(self, arm: Arm, ep: OpenAIEndpoint, progress: Callable[[str], None]) -> None:
        assert ep.metrics_url is not None
        try:
            profile, reason = detect(scrape(ep.metrics_url))
        except (OSError, ValueError) as exc:
            profile, reason = None, f"{ep.metrics_url}: {getattr(exc, 'reason', None) or exc}"
        if profile is None:
            self.notes[arm.variant] = str(reason)
            progress(f"bench: external arm {arm.variant}: acceptance unknown ({reason})")
        else:
            self.probes[arm.variant] = MetricsProbe(ep.metrics_url, profile, ep.model)

    def info(self, chat_routes: list[str]) -> External:
        """What run.json records about the external arms (``chat_routes``: the
        routes whose prompts the servers render with their own chat template)."""
        if not self.arms:
            return {}
        out: dict[str, ExternalArm] = {}
        for arm in self.arms:
            ep = arm.openai
            assert ep is not None
            probe = self.probes.get(arm.variant)
            out[arm.variant] = {
                "openai": ep.url,
                "model": ep.model,
                "baseline": arm.baseline,
                "metrics": ep.metrics_url,
                "acceptance_counters": probe.profile.runtime if probe else None,
                "acceptance_note": self.notes.get(arm.variant),
            }
        return {"arms": out, "chat_routes": chat_routes}

    # -- acceptance windows -----------------------------------------------------------

    def scrape_for(self, job: Job) -> Scrape | None:
        """Per-request counter deltas, at concurrency 1 only (one request in
        flight, so the server's counters move for this request alone)."""
        arm = job.arm
        if arm.openai is None or not arm.speculative:
            return None
        if job.concurrency != 1:
            return lambda: {
                "acceptance_source": None,
                "acceptance_note": "counted per cell (concurrency > 1)",
            }
        probe = self.probes.get(arm.variant)
        if probe is None:
            note = self.notes.get(arm.variant, "no metrics endpoint")
            return lambda: acceptance_fields(None, note)
        try:
            before = probe.snapshot()
        except (OSError, ValueError) as exc:
            failed = f"metrics scrape failed: {exc}"
            return lambda: acceptance_fields(None, failed)

        def after() -> AcceptanceFields:
            try:
                return acceptance_fields(probe.settled().minus(before))
            except (OSError, ValueError) as exc:
                return acceptance_fields(None, f"metrics scrape failed: {exc}")

        return after

    @contextlib.contextmanager
    def cell_window(
        self,
        route: str,
        load: str,
        concurrency: int | None,
        temperature: float,
        arms: list[Arm],
        *,
        record: Callable[[AcceptanceSample], None],
    ) -> Iterator[None]:
        """Counter deltas over a whole cell when more than one request may be
        in flight: one sample per speculative external arm into ``record``."""
        spec_arms = [a for a in arms if a.openai is not None and a.speculative]
        if concurrency == 1 or not spec_arms:
            yield
            return
        by_url: dict[str, list[str]] = {}
        for a in spec_arms:
            if a.variant in self.probes:
                by_url.setdefault(self.probes[a.variant].url, []).append(a.variant)
        before: dict[str, Counts] = {}
        for a in spec_arms:
            probe = self.probes.get(a.variant)
            if probe is not None and len(by_url[probe.url]) == 1:
                with contextlib.suppress(OSError, ValueError):
                    before[a.variant] = probe.snapshot()
        yield
        for a in spec_arms:
            probe = self.probes.get(a.variant)
            if probe is None:
                fields = acceptance_fields(None, self.notes.get(a.variant, "no metrics"))
            elif len(by_url[probe.url]) > 1:
                fields = acceptance_fields(
                    None,
                    "arms "
                    + ", ".join(by_url[probe.url])
                    + " share one metrics page; their traffic in one "
                    "cell cannot be told apart",
                )
            elif a.variant not in before:
                fields = acceptance_fields(None, f"metrics scrape failed: {probe.url}")
            else:
                try:
                    fields = acceptance_fields(probe.settled().minus(before[a.variant]))
                except (OSError, ValueError) as exc:
                    fields = acceptance_fields(None, f"metrics scrape failed: {exc}")
            record(cell_sample(route, load, temperature, a.variant, fields))

    def worker_factory(self, triton_url: str, request_timeout_s: float) -> Callable[[], Any]:
        return lambda: ArmWorker(triton_url, request_timeout_s, self.scrape_for)
