"""Load generation over tritonclient gRPC streaming against the orchestrator
models of docs/design/orchestrator.md. Each worker thread owns one client and one
bidirectional stream and has one request in flight at a time; the stream's
callback only timestamps and queues a response, and the worker does the
parsing, so the time spent in our own code per request is measured apart
(``overhead_ns``). Closed loop = N workers pulling from a shared job queue;
open loop = a dispatcher releasing jobs at Poisson arrival times into a worker
pool, recording how late each send was against its schedule. A ``LagProbe``
thread measures how late a 10 ms sleep wakes up: the threads' analogue of
event-loop lag, which exposes GIL or CPU starvation that would distort
client-side timings."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import numpy as np

from trtspec.bench import stats
from trtspec.bench.routes import PromptItem

if TYPE_CHECKING:
    from trtspec.bench.openai_client import OpenAIEndpoint

_POLL_S = 0.2


FinalInt = Literal[
    "prompt_tokens",
    "completion_tokens",
    "draft_tokens",
    "accepted_tokens",
    "rounds",
    "server_ttft_ns",
    "server_total_ns",
    "prefix_reused_tokens",
]


class FinalFields(TypedDict, total=False):
    """What a request's final response said, before it becomes a row
    (Recorder.row): a Triton arm's output tensors, or an OpenAI stream's
    usage chunk, finish reason and scraped acceptance counts."""

    prompt_tokens: int | None
    completion_tokens: int | None
    draft_tokens: int | None
    accepted_tokens: int | None
    rounds: int | None
    server_ttft_ns: int | None
    server_total_ns: int | None
    prefix_reused_tokens: int | None
    variant: str | None  # the variant that served it (the router's choice)
    fallback: bool | None
    drafted_per_position: dict[str, int]
    accepted_per_position: dict[str, int] | None
    finish_reason: str | None
    acceptance_source: str | None
    acceptance_note: str | None
    avg_decoded_tokens_per_iter: float  # trtllm-serve's per-request mean


@dataclass(frozen=True)
class Arm:
    """One thing compared: the baseline, or a variant at one k."""

    variant: str
    model: str
    mode: str = "none"
    speculative: bool = False
    draft_model: str | None = None
    k: int | None = None
    # External arms (bench.external): the OpenAI server, and the arm a
    # speculative one pairs with instead of trtspec's `baseline`.
    openai: OpenAIEndpoint | None = None
    baseline: str | None = None

    @property
    def label(self) -> str:
        return self.variant if self.k is None else f"{self.variant}(k={self.k})"


@dataclass
class Job:
    route: str
    prompt_index: int
    sample_index: int
    item: PromptItem
    text_input: str
    max_tokens: int
    arm: Arm
    temperature: float
    top_p: float
    top_k: int
    seed: int
    load: str
    concurrency: int | None
    request_rate: float | None
    warmup: bool
    request_id: str
    scheduled_ns: int | None = None
    # --prefix-cache warm: send the same prompt with max_tokens 1 on the same
    # stream first (not recorded), so the measured request finds it cached.
    prime: bool = False


@dataclass
class Outcome:
    job: Job
    send_ns: int = 0
    send_time_unix: float = 0.0
    first_text_ns: int | None = None
    end_ns: int | None = None
    text: str = ""
    ids: list[int] = field(default_factory=list)
    final: FinalFields = field(default_factory=FinalFields)
    error: str | None = None
    overhead_ns: int = 0  # CPU time of this thread in our code (build, send, parse)
    overhead_wall_ns: int = 0  # the same spans in wall time (includes being descheduled)
    responses: int = 0
    send_lag_ns: int | None = None
    # Set when the failure was the infrastructure's (a stub crash, a server
    # that died or stopped answering), not the variant's: its kind.
    incident: str | None = None


def build_inputs(job: Job) -> list[Any]:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: Any, dtype: str, np_dtype: Any) -> Any:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np_dtype))
        return t

    inputs = [
        tensor("text_input", job.text_input.encode("utf-8"), "BYTES", np.object_),
        tensor("max_tokens", job.max_tokens, "INT32", np.int32),
        tensor("temperature", job.temperature, "FP32", np.float32),
        tensor("top_k", job.top_k, "INT32", np.int32),
        tensor("top_p", job.top_p, "FP32", np.float32),
        tensor("seed", job.seed, "UINT64", np.uint64),
        tensor("stream", True, "BOOL", bool),
        tensor("route", job.route.encode("utf-8"), "BYTES", np.object_),
        tensor("request_id", job.request_id.encode("utf-8"), "BYTES", np.object_),
    ]
    if job.arm.k is not None:
        inputs.append(tensor("num_draft_tokens", job.arm.k, "INT32", np.int32))
    return inputs


_FINAL_INT: tuple[FinalInt, ...] = (
    "prompt_tokens",
    "completion_tokens",
    "draft_tokens",
    "accepted_tokens",
    "rounds",
    "server_ttft_ns",
    "server_total_ns",
    "prefix_reused_tokens",
)


def _scalar(result: Any, name: str) -> Any:
    arr = result.as_numpy(name)
    if arr is None or arr.size == 0:
        return None
    return arr.reshape(-1)[0]


def _positions(arr: Any) -> FinalFields:
    """Per-position draft counts of a final response as row fields
    ({"1": n, …}); nothing where the variant reported none."""
    if arr is None or arr.ndim != 2 or arr.shape[0] != 2 or arr.shape[1] == 0:
        return {}
    drafted, accepted = arr.tolist()
    return {
        "drafted_per_position": {str(j + 1): int(n) for j, n in enumerate(drafted)},
        "accepted_per_position": {str(j + 1): int(n) for j, n in enumerate(accepted)},
    }


def grpc_client(url: str) -> Any:
    """A tritonclient gRPC client whose channel comes back within a second of
    its server's restart: its own subchannel pool (gRPC shares subchannels,
    and their reconnect backoff, between channels to the same address by
    default, so a "fresh" client would wait out the old one's backoff — up to
    two minutes) and a reconnect backoff of 0.1 s to 1 s. The rest are
    tritonclient's own defaults."""
    import tritonclient.grpc as grpcclient

    keepalive = grpcclient.KeepAliveOptions()
    size = grpcclient.MAX_GRPC_MESSAGE_SIZE
    return grpcclient.InferenceServerClient(
        url,
        channel_args=[
            ("grpc.max_send_message_length", size),
            ("grpc.max_receive_message_length", size),
            ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
            ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        ],
    )


class StreamWorker:
    """One client, one stream, one request in flight."""

    def __init__(self, url: str, request_timeout_s: float) -> None:
        self.url = url
        self.request_timeout_s = request_timeout_s
        self._client = grpc_client(url)
        self._responses: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
        self._in_flight = False  # a request sent whose final response has not come
        self._client.start_stream(callback=self._callback)

    def _callback(self, result: Any, error: Any) -> None:
        # runs on the gRPC stream thread: timestamp first, nothing else
        self._responses.put((time.perf_counter_ns(), result, error))

    def _restart_stream(self) -> None:
        with contextlib.suppress(Exception):
            self._client.stop_stream(cancel_requests=True)
        self._in_flight = False
        self._responses = queue.Queue()
        self._client.start_stream(callback=self._callback)

    def reconnect(self) -> None:
        """A new client (a new gRPC channel, free of the reconnect backoff
        the old one entered when its server went away) and a new stream."""
        self.close()
        self._client = grpc_client(self.url)
        self._responses = queue.Queue()
        self._client.start_stream(callback=self._callback)

    def close(self) -> None:
        # Cancel only a request still in flight. Cancelling an idle stream is
        # not free on tritonserver 2.51: a decoupled Python model whose
        # finished requests' stream was cancelled stays "live" at shutdown
        # until the exit timeout (seen on the echo and router models), so
        # every server a bench had used took its whole stop grace.
        with contextlib.suppress(Exception):
            self._client.stop_stream(cancel_requests=self._in_flight)
        self._in_flight = False
        with contextlib.suppress(Exception):
            self._client.close()

    def _send(self, job: Job, inputs: list[Any]) -> None:
        try:
            self._client.async_stream_infer(job.arm.model, inputs, request_id=job.request_id)
        except Exception:
            # A stream that broke between requests (its server was restarted
            # meanwhile) is not this request's failure: one fresh client, one retry.
            self.reconnect()
            self._client.async_stream_infer(job.arm.model, inputs, request_id=job.request_id)

    def run(self, job: Job, stop: threading.Event | None = None) -> Outcome:
        out = Outcome(job)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        inputs = build_inputs(job)
        out.send_time_unix = time.time()
        out.send_ns = time.perf_counter_ns()
        if job.scheduled_ns is not None:
            out.send_lag_ns = max(0, out.send_ns - job.scheduled_ns)
        try:
            self._in_flight = True
            self._send(job, inputs)
        except Exception as exc:  # a client-side failure is a failed request, not a crash
            out.error = f"send failed: {exc}"
            self._restart_stream()
            return out
        out.overhead_wall_ns = time.perf_counter_ns() - t0
        out.overhead_ns = time.thread_time_ns() - c0
        deadline = out.send_ns + int(self.request_timeout_s * 1e9)
        while True:
            remaining = (deadline - time.perf_counter_ns()) / 1e9
            if remaining <= 0 or (stop is not None and stop.is_set()):
                out.error = (
                    "interrupted"
                    if stop is not None and stop.is_set()
                    else f"timeout: no final response within {self.request_timeout_s:g}s"
                )
                out.end_ns = time.perf_counter_ns()
                self._restart_stream()
                return out
            try:
                arrived, result, error = self._responses.get(timeout=min(remaining, _POLL_S))
            except queue.Empty:
                continue
            p0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            if error is not None:
                out.error = str(error).strip() or type(error).__name__
                out.end_ns = arrived
                self._restart_stream()
                return out
            resp_id = result.get_response().id
            if resp_id and resp_id != job.request_id:
                continue  # a late response of an earlier, abandoned request
            out.responses += 1
            delta = _scalar(result, "text_output")
            text = (
                delta.decode("utf-8", errors="replace")
                if isinstance(delta, bytes)
                else ("" if delta is None else str(delta))
            )
            ids = result.as_numpy("output_ids")
            if ids is not None and ids.size:
                out.ids.extend(int(i) for i in ids.reshape(-1))
            if text:
                out.text += text
                if out.first_text_ns is None:
                    out.first_text_ns = arrived
            final = _scalar(result, "is_final")
            if final is not None and bool(final):
                for name in _FINAL_INT:
                    v = _scalar(result, name)
                    out.final[name] = None if v is None else int(v)
                served = _scalar(result, "variant")
                out.final["variant"] = served.decode() if isinstance(served, bytes) else served
                fb = _scalar(result, "fallback")
                out.final["fallback"] = None if fb is None else bool(fb)
                out.final.update(_positions(result.as_numpy("position_acceptance")))
                out.end_ns = arrived
                out.overhead_wall_ns += time.perf_counter_ns() - p0
                out.overhead_ns += time.thread_time_ns() - c0
                self._in_flight = False
                return out
            out.overhead_wall_ns += time.perf_counter_ns() - p0
            out.overhead_ns += time.thread_time_ns() - c0


class LagProbe:
    """Samples how late a short sleep wakes up while the load runs."""

    def __init__(self, interval_s: float = 0.01) -> None:
        self.interval_s = interval_s
        self.lags_ms: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trtspec-lag-probe", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(self.interval_s)
            self.lags_ms.append(max(0.0, (time.perf_counter() - t - self.interval_s) * 1e3))

    def __enter__(self) -> LagProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1)

    def summary(self) -> dict[str, float | None]:
        return {
            "lag_ms_p50": stats.percentile(self.lags_ms, 50),
            "lag_ms_p95": stats.percentile(self.lags_ms, 95),
            "lag_ms_max": max(self.lags_ms) if self.lags_ms else None,
            "lag_samples": float(len(self.lags_ms)),
        }


def poisson_schedule(n: int, rate: float, seed: int) -> list[float]:
    """Arrival offsets (s) of ``n`` requests at ``rate`` req/s, reproducible."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def _join_all(threads: list[threading.Thread], stop: threading.Event) -> None:
    # short joins keep the main thread responsive to Ctrl-C
    for t in threads:
        while t.is_alive():
            t.join(_POLL_S)


def run_jobs(
    url: str,
    jobs: list[Job],
    *,
    workers: int,
    on_done: Callable[[Outcome], None],
    stop: threading.Event,
    request_timeout_s: float,
    schedule_s: list[float] | None = None,
    recover: Callable[[Outcome], bool] | None = None,
    make_worker: Callable[[], Any] | None = None,
) -> None:
    """Run ``jobs`` with ``workers`` streams. Without ``schedule_s`` it is a
    closed loop (each worker sends its next job when the last one finished);
    with it, job i is released ``schedule_s[i]`` seconds after the start.
    When a request fails and ``recover(outcome)`` says the server was brought
    back, that job is sent once more and only the second attempt is reported.
    ``make_worker`` builds each worker (default: a ``StreamWorker`` on ``url``)."""
    run_blocks(
        url,
        [jobs],
        workers=workers,
        on_done=on_done,
        stop=stop,
        request_timeout_s=request_timeout_s,
        schedule_s=schedule_s,
        recover=recover,
        make_worker=make_worker,
    )


def run_blocks(
    url: str,
    blocks: list[list[Job]],
    *,
    workers: int,
    on_done: Callable[[Outcome], None],
    stop: threading.Event,
    request_timeout_s: float,
    schedule_s: list[float] | None = None,
    recover: Callable[[Outcome], bool] | None = None,
    make_worker: Callable[[], Any] | None = None,
) -> None:
    """``run_jobs`` over ``blocks`` in turn, one pool of streams for all: a
    block's jobs go out only when every job of the one before has finished
    (bench/blocks.py: one arm's requests in flight at a time). A schedule
    (open loop) needs a single block."""
    if schedule_s is not None and len(blocks) != 1:
        raise ValueError("an open-loop schedule runs one block")
    pending: queue.Queue[Job | None] = queue.Queue()
    factory = make_worker or (lambda: StreamWorker(url, request_timeout_s))
    pool = [factory() for _ in range(max(1, workers))]
    finished = threading.Condition()
    done_count = [0]

    def work(worker: Any) -> None:
        while not stop.is_set():
            try:
                job = pending.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if job is None:
                return
            if job.prime and not stop.is_set():
                worker.run(
                    dataclasses.replace(
                        job,
                        max_tokens=1,
                        prime=False,
                        warmup=True,
                        request_id=f"{job.request_id}-prime",
                    ),
                    stop,
                )
            outcome = worker.run(job, stop)
            if (
                outcome.error is not None
                and recover is not None
                and not stop.is_set()
                and recover(outcome)
            ):
                worker.reconnect()  # its stream went down with the old server
                outcome = worker.run(job, stop)
            on_done(outcome)
            with finished:
                done_count[0] += 1
                finished.notify_all()

    threads = [
        threading.Thread(target=work, args=(w,), daemon=True, name=f"trtspec-worker-{i}")
        for i, w in enumerate(pool)
    ]
    for t in threads:
        t.start()
    try:
        if schedule_s is None:
            sent = 0
            for jobs in blocks:
                for job in jobs:
                    pending.put(job)
                sent += len(jobs)
                with finished:
                    # short waits keep the main thread responsive to Ctrl-C
                    while done_count[0] < sent and not stop.is_set():
                        if not any(t.is_alive() for t in threads):
                            break  # every worker died: nothing will finish
                        finished.wait(_POLL_S)
                if stop.is_set():
                    break
        else:
            start = time.perf_counter_ns()
            for job, offset in zip(blocks[0], schedule_s, strict=True):
                job.scheduled_ns = start + int(offset * 1e9)
                while not stop.is_set():
                    wait = (job.scheduled_ns - time.perf_counter_ns()) / 1e9
                    if wait <= 0:
                        break
                    time.sleep(min(wait, _POLL_S))
                if stop.is_set():
                    break
                pending.put(job)
        for _ in pool:
            pending.put(None)
        _join_all(threads, stop)
    except BaseException:
        stop.set()
        _join_all(threads, stop)
        raise
    finally:
        for w in pool:
            w.close()
