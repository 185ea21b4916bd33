"""How much the trtspec bench client costs, measured against a no-op engine.

Serves the echo orchestrator (``trtspec.bench.echo_model``) with no per-round
delay through the real tritonserver of ``trtspec.serve``, then measures:

1. the trtspec client in closed loop at several concurrency levels: achieved
   request rate, time spent in our own code per request (building inputs,
   sending, parsing responses), and the lag probe (how late a 10 ms sleep
   wakes up while the load runs);
2. the trtspec client in open loop at rising Poisson rates: the highest rate
   it sustains (>= 95 % of the offered rate completed, p95 send lag against
   the schedule <= 10 ms, no errors);
3. the same requests from a plain synchronous tritonclient loop (one stream,
   send, wait for the final response, repeat), as the reference point. AIPerf
   was not used: ``aiperf`` 0.13 pulls ~40 dependencies (kubernetes, dash,
   datasets, pandas, pyarrow ...) into the environment, which the shared venv
   must not take.

Run: ``.venv/bin/python benchmarks/bench_overhead.py [--requests 300] [--json out.json]``.
Loopback only; everything it starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.bench import stats
from trtspec.bench.client import Arm, Job, LagProbe, Outcome, poisson_schedule, run_jobs
from trtspec.bench.echo_model import write_echo_repository
from trtspec.serve import Server

MAX_TOKENS = 8
PROMPT = "The quick brown fox jumps over the lazy dog. "


def jobs(n: int, model: str = "noop") -> list[Job]:
    arm = Arm(model, model)
    return [
        Job(
            route="overhead",
            prompt_index=0,
            sample_index=i,
            item={},
            text_input=PROMPT,
            max_tokens=MAX_TOKENS,
            arm=arm,
            temperature=0.0,
            top_p=1.0,
            top_k=0,
            seed=i,
            load="",
            concurrency=None,
            request_rate=None,
            warmup=False,
            request_id=f"o{i}",
        )
        for i in range(n)
    ]


def run_ours(
    url: str, n: int, *, workers: int, rate: float | None = None
) -> tuple[list[Outcome], float, dict[str, Any]]:
    done: list[Outcome] = []
    lock = threading.Lock()

    def record(o: Outcome) -> None:
        with lock:
            done.append(o)

    schedule = poisson_schedule(n, rate, seed=1) if rate else None
    with LagProbe() as probe:
        t0 = time.perf_counter()
        run_jobs(
            url,
            jobs(n),
            workers=workers,
            on_done=record,
            stop=threading.Event(),
            request_timeout_s=30,
            schedule_s=schedule,
        )
        wall = time.perf_counter() - t0
    return done, wall, probe.summary()


def run_plain(url: str, n: int) -> tuple[float, list[float]]:
    """The simplest correct client for a decoupled model: one stream,
    one request at a time, block until the final response."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    responses: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    latencies = []
    t0 = time.perf_counter()
    for i in range(n):
        text = grpcclient.InferInput("text_input", [1], "BYTES")
        text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=np.object_))
        mt = grpcclient.InferInput("max_tokens", [1], "INT32")
        mt.set_data_from_numpy(np.array([MAX_TOKENS], dtype=np.int32))
        s = time.perf_counter()
        client.async_stream_infer("noop", [text, mt], request_id=f"p{i}")
        while True:
            result, error = responses.get(timeout=30)
            if error is not None:
                raise RuntimeError(error)
            if bool(result.as_numpy("is_final")[0]):
                break
        latencies.append((time.perf_counter() - s) * 1e3)
    wall = time.perf_counter() - t0
    client.stop_stream()
    client.close()
    return wall, latencies


def summarize(done: list[Outcome], wall: float, probe: dict[str, Any]) -> dict[str, Any]:
    ok = [o for o in done if not o.error and o.end_ns]
    lat = [(o.end_ns - o.send_ns) / 1e6 for o in ok if o.end_ns]
    over = [o.overhead_ns / 1e6 for o in ok]
    lag = [o.send_lag_ns / 1e6 for o in ok if o.send_lag_ns is not None]
    # from the first send to the last final response: leaves out the start-up
    # of the worker pool, which is not part of the load
    span = (max(o.end_ns for o in ok) - min(o.send_ns for o in ok)) / 1e9 if ok else 0.0
    return {
        "requests": len(done),
        "errors": len(done) - len(ok),
        "wall_s": wall,
        "span_s": span,
        "req_per_s": len(ok) / span if span else None,
        "latency_ms_p50": stats.percentile(lat, 50),
        "latency_ms_p95": stats.percentile(lat, 95),
        "overhead_ms_p50": stats.percentile(over, 50),
        "overhead_ms_p95": stats.percentile(over, 95),
        "send_lag_ms_p95": stats.percentile(lag, 95),
        "probe_lag_ms_p95": probe.get("lag_ms_p95"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests per closed-loop level")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--rates", default="100,200,400,600,800")
    ap.add_argument("--seconds", type=float, default=3.0, help="length of each open-loop step")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    results: dict[str, Any] = {"closed_loop": {}, "open_loop": {}, "plain_sync": {}}
    with tempfile.TemporaryDirectory(prefix="trtspec-overhead-") as tmp:
        repo = write_echo_repository(
            Path(tmp) / "repo", {"noop": {"round_ms": 0, "max_accept": 10_000}}
        )
        with Server(repo, log_path=Path(tmp) / "tritonserver.log") as server:
            url = server.grpc_url
            run_ours(url, 20, workers=2)  # warm the server and the client's imports
            wall, lat = run_plain(url, args.requests)
            results["plain_sync"] = {
                "requests": args.requests,
                "wall_s": wall,
                "req_per_s": args.requests / wall,
                "latency_ms_p50": stats.percentile(lat, 50),
                "latency_ms_p95": stats.percentile(lat, 95),
            }
            for c in (int(x) for x in args.concurrency.split(",")):
                done, wall, probe = run_ours(url, args.requests, workers=c)
                results["closed_loop"][c] = summarize(done, wall, probe)
            best = None
            for rate in (float(x) for x in args.rates.split(",")):
                n = max(10, int(rate * args.seconds))
                done, wall, probe = run_ours(url, n, workers=16, rate=rate)
                s = summarize(done, wall, probe)
                # the realised Poisson rate of this schedule, not the nominal one
                offered = n / poisson_schedule(n, rate, seed=1)[-1]
                s["offered_req_per_s"] = offered
                s["sustained"] = bool(
                    s["errors"] == 0
                    and s["req_per_s"]
                    and s["req_per_s"] >= 0.95 * offered
                    and (s["send_lag_ms_p95"] or 0) <= 10.0
                )
                results["open_loop"][rate] = s
                if not s["sustained"]:
                    break  # the highest rate is the last one before the first failure
                best = rate
            results["highest_sustained_rate"] = best
    p = results["plain_sync"]
    print(
        f"plain synchronous tritonclient loop: {p['req_per_s']:.0f} req/s, "
        f"latency p50 {p['latency_ms_p50']:.2f} ms"
    )
    for c, s in results["closed_loop"].items():
        print(
            f"trtspec client closed loop c={c}: {s['req_per_s']:.0f} req/s, latency p50 "
            f"{s['latency_ms_p50']:.2f} ms, our overhead p50 {s['overhead_ms_p50']:.3f} ms "
            f"p95 {s['overhead_ms_p95']:.3f} ms, lag probe p95 {s['probe_lag_ms_p95']:.2f} ms"
        )
    for r, s in results["open_loop"].items():
        print(
            f"trtspec client open loop {r:g} req/s nominal ({s['offered_req_per_s']:.0f} "
            f"offered): {s['req_per_s']:.0f} req/s done, "
            f"send lag p95 {s['send_lag_ms_p95']:.2f} ms, "
            f"{'sustained' if s['sustained'] else 'NOT sustained'}"
        )
    print(f"highest sustained open-loop rate: {results['highest_sustained_rate']} req/s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
