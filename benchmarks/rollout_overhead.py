"""What the rollout's per-request log and router metrics cost: requests/s
through the real ``router`` model with them on and off.

Serves two echo orchestrators (``trtspec.bench.echo_model``, no per-round
delay, so the router and the server are all there is to measure) behind the
router, one route at 50% canary, and sends ``--requests`` requests of 4
tokens at ``--concurrency`` in closed loop (one gRPC stream per worker).
"on" = the request log to its rotating file plus the Prometheus series;
"off" = ``log.destination: off`` and ``TRTSPEC_ROUTER_METRICS=0`` (the same
router code otherwise). The two are alternated ``--rounds`` times, each on a
fresh server, so a drift of the shared machine falls on both.

Measured (2026-12-01, shared two-core machine, 8 streams): on 191.2,
170.9, 144.9, 153.4, 196.2 req/s; off 171.0, 150.9 req/s. Not understood
yet: twice an "off" round's closed loop stopped making progress (the
router's stub idle, the client's workers waiting) and was interrupted.

Run: ``.venv/bin/python benchmarks/rollout_overhead.py [--requests 600]``.
Loopback only; every server it starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from trtspec.artifacts import rollout_state as st
from trtspec.bench.client import StreamWorker
from trtspec.bench.echo_model import write_echo_repository
from trtspec.repo import assemble
from trtspec.serve import Server

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fixtures: the echo router helpers

from tests.fixtures.router_jobs import add_router, router_job  # noqa: E402


def make_repo(root: Path, *, logging: bool) -> Path:
    repo = write_echo_repository(root, {"baseline": {}, "ngram": {"max_accept": 3}})
    add_router(repo, ["baseline", "ngram"], {"code": {"variant": "ngram", "canary_percent": 50}})
    base = st.RolloutConfig()
    config = st.RolloutConfig(
        model="echo",
        auto_rollback=False,
        log={**base.log, "destination": "file" if logging else "off"},
    )
    (repo / assemble.ROUTER / st.CONFIG_FILE).write_text(json.dumps(config.to_dict()))
    return repo


def drive(url: str, n: int, concurrency: int, tag: str) -> tuple[float, int]:
    """(requests/s, errors) for ``n`` requests in closed loop."""
    todo = list(range(n))
    lock = threading.Lock()
    errors = [0]

    def work() -> None:
        worker = StreamWorker(url, 60)
        try:
            while True:
                with lock:
                    if not todo:
                        return
                    i = todo.pop()
                job = router_job("code", f"{tag}-{i}", "abcdefghijklmnop", 4, concurrency)
                if worker.run(job).error:
                    with lock:
                        errors[0] += 1
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(concurrency)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return n / (time.perf_counter() - started), errors[0]


def measure(on: bool, requests: int, concurrency: int, root: Path) -> tuple[float, int]:
    repo = make_repo(root / ("on" if on else "off"), logging=on)
    env_before = os.environ.get("TRTSPEC_ROUTER_METRICS")
    os.environ["TRTSPEC_ROUTER_METRICS"] = "1" if on else "0"
    try:
        with Server(repo, log_path=root / f"server-{'on' if on else 'off'}.log") as server:
            drive(server.grpc_url, 50, concurrency, "warm")  # stubs and streams warm
            return drive(server.grpc_url, requests, concurrency, "run")
    finally:
        if env_before is None:
            os.environ.pop("TRTSPEC_ROUTER_METRICS", None)
        else:
            os.environ["TRTSPEC_ROUTER_METRICS"] = env_before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="rollout-overhead-") as tmp:
        for r in range(args.rounds):
            for on in (True, False):
                tmp_round = Path(tmp) / f"r{r}"
                rate, errors = measure(on, args.requests, args.concurrency, tmp_round)
                key = "on" if on else "off"
                results[key].append(rate)
                print(
                    f"round {r + 1} log+metrics {key}: {rate:.1f} req/s, {errors} errors",
                    file=sys.stderr,
                    flush=True,
                )
                if on:
                    lines = sum(
                        1
                        for _ in (tmp_round / "on" / "router" / "rollout" / "requests.jsonl").open()
                    )
                    print(f"    request log: {lines} lines", file=sys.stderr)
    on_m, off_m = statistics.median(results["on"]), statistics.median(results["off"])
    print(
        json.dumps(
            {
                "requests": args.requests,
                "concurrency": args.concurrency,
                "on_req_per_s": results["on"],
                "off_req_per_s": results["off"],
                "median_on": round(on_m, 1),
                "median_off": round(off_m, 1),
                "cost": round(1 - on_m / off_m, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
