"""Soak test of the Python-backend stubs: streamed requests through the router
of a real reference-backend repository, under the real tritonserver, with the
stub watchdog of ``trtspec.serve`` recovering from any dead stub.

It builds a tiny random Llama (tests/fixtures/tiny_model.py) and a repository
with the baseline, an ``ngram`` variant (the orchestrator's non-decoupled
draft loop) and a ``lookahead`` variant (a decoupled BLS stream from the
engine), routes three routes through the router (ngram, lookahead, baseline),
then sends ``--requests`` streamed requests at each ``--concurrency`` level and
reports:

- requests, failed requests, and stub crashes (the watchdog's incidents:
  a stub that became a zombie, with the signal that killed it);
- recoveries (server restarted on the same ports, model serving again) and
  their p95 time, from the crash being noticed to the server being ready;
- the server process tree's RSS every ``--rss-every`` requests and its trend
  (least-squares slope, MB per 1,000 requests).

``--inject-every N`` SIGSEGVs a random stub every N requests, to measure the
recovery path itself; injected crashes are reported apart from the natural
ones. ``--no-workaround`` starts the server with ``TRTSPEC_BLS_WORKAROUND=0``
(the models then release BLS response iterators and prune outputs as they did
before the crash fix), for a before/after comparison.

Run: ``.venv/bin/python benchmarks/soak_stubs.py [--requests 1000]
[--concurrency 1 4] [--max-minutes 30] [--json out.json]``. Loopback only;
bounded by ``--requests`` per level and ``--max-minutes`` in all; everything it
starts is stopped before it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trtspec.bench import stats
from trtspec.bench.cells import server_memory
from trtspec.bench.client import Arm, Job, Outcome, run_jobs
from trtspec.serve import Server, StubWatchdog, read_manifest, stubs_of

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fixtures: the tiny model builder

SPEC = """\
name: soak
backend: reference
target: {{model: {target}, family: llama, dtype: float32, max_batch_size: 4,
         max_input_len: 256, max_seq_len: 512, max_num_tokens: 1024}}
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 2}}
  - {{name: lookahead, mode: lookahead, window_size: 2, ngram_size: 2, verification_set_size: 2}}
rollout: {{canary_percent: 100, fallback_variant: baseline}}
"""

ROUTING = """\
schema_version: 1
default_variant: baseline
routes:
  code: {variant: ngram, num_draft_tokens: 3, decision: promote}
  chat: {variant: lookahead, decision: promote}
  plain: {variant: baseline, decision: exclude}
"""

PROMPTS = [
    ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return fib"),
    ("chat", "Hello! How are you today? I am fine, thank you. Hello! How are"),
    ("plain", "The quick brown fox jumps over the lazy dog. The quick brown fox"),
]


def build_repo(work: Path) -> Path:
    from tests.fixtures.tiny_model import make_tiny_llama

    from trtspec.artifacts.routing import load_routing
    from trtspec.build.reference import build, parse_args
    from trtspec.plan import make_plan
    from trtspec.repo.assemble import assemble
    from trtspec.spec import load_spec

    target = make_tiny_llama(work / "tiny-llama")
    (work / "spec.yaml").write_text(SPEC.format(target=target), encoding="utf-8")
    (work / "routing.yaml").write_text(ROUTING, encoding="utf-8")
    spec = load_spec(work / "spec.yaml")
    plan = make_plan(spec, work / "engines")
    for step in plan.steps:
        build(parse_args(list(step.argv[3:])))
    return assemble(
        spec,
        plan,
        work / "engines",
        work / "triton_repo",
        routing=load_routing(work / "routing.yaml"),
    )


def jobs(n: int, level: int, max_tokens: int) -> list[Job]:
    arm = Arm("router", "router")
    out = []
    for i in range(n):
        route, prompt = PROMPTS[i % len(PROMPTS)]
        out.append(
            Job(
                route=route,
                prompt_index=i % len(PROMPTS),
                sample_index=i,
                item={},
                text_input=prompt,
                max_tokens=max_tokens,
                arm=arm,
                temperature=0.0,
                top_p=1.0,
                top_k=0,
                seed=i,
                load=f"concurrency={level}",
                concurrency=level,
                request_rate=None,
                warmup=False,
                request_id=f"soak-c{level}-{i}",
            )
        )
    return out


def slope_mb_per_1000(points: list[tuple[int, float]]) -> float | None:
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return None if var == 0 else 1000 * sum((x - mx) * (y - my) for x, y in points) / var


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000, help="requests per concurrency level")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--inject-every", type=int, default=0)
    ap.add_argument("--rss-every", type=int, default=100)
    ap.add_argument("--no-workaround", action="store_true")
    ap.add_argument("--work-dir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="trtspec-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    t_build = time.monotonic()
    repo = build_repo(work)
    print(f"soak: repository {repo} built in {time.monotonic() - t_build:.1f} s", file=sys.stderr)
    env = {"TRTSPEC_BLS_WORKAROUND": "0"} if args.no_workaround else {}
    server = Server(
        repo,
        models=sorted(read_manifest(repo)["models"]),
        log_path=work / "tritonserver.log",
        env=env,
    )
    server.start(timeout=600)
    lock = threading.Lock()
    done: list[Outcome] = []
    resent: list[str] = []
    rss: list[tuple[int, float]] = []
    injected: set[int] = set()
    rng = random.Random(0)
    stop = threading.Event()
    deadline = time.monotonic() + args.max_minutes * 60
    timer = threading.Timer(args.max_minutes * 60, stop.set)
    timer.daemon = True
    timer.start()

    def say(incident: Any) -> None:
        print(
            f"soak: {incident.message()}; {incident.action} in {incident.recovery_s:.1f} s",
            file=sys.stderr,
        )

    watchdog = StubWatchdog(server, on_incident=say).prime().start()

    def record(out: Outcome) -> None:
        with lock:
            done.append(out)
            n = len(done)
        if args.rss_every and n % args.rss_every == 0:
            mem, _kind = server_memory(None, server.pid)
            if mem is not None:
                rss.append((n, mem / 2**20))
        if args.inject_every and n % args.inject_every == 0:
            stubs = [p for p, s in stubs_of(server.pid or 0).items() if not s.zombie]
            if stubs:
                pid = rng.choice(stubs)
                injected.add(pid)
                os.kill(pid, signal.SIGSEGV)

    def recover(out: Outcome) -> bool:
        watchdog.check()  # waits for a restart in progress; finds a crash before the next tick
        lost = any(m in (out.error or "") for m in ("UNAVAILABLE", "send failed"))
        if watchdog.incidents_since(out.send_ns) or (lost and watchdog.incidents):
            with lock:
                resent.append(out.job.request_id)
            return True
        return False

    started = time.monotonic()
    levels = []
    try:
        for level in args.concurrency:
            if stop.is_set():
                break
            t0, before = time.monotonic(), len(done)
            run_jobs(
                server.grpc_url,
                jobs(args.requests, level, args.max_tokens),
                workers=level,
                on_done=record,
                stop=stop,
                request_timeout_s=args.request_timeout,
                recover=recover,
            )
            levels.append(
                {
                    "concurrency": level,
                    "requests": len(done) - before,
                    "seconds": round(time.monotonic() - t0, 1),
                }
            )
            print(
                f"soak: concurrency {level}: {len(done) - before} requests in "
                f"{time.monotonic() - t0:.0f} s",
                file=sys.stderr,
            )
    finally:
        timer.cancel()
        watchdog.stop()
        log = server.log_text()
        server.stop()
    natural = [i for i in watchdog.incidents if i.pid not in injected]
    crashes = [i for i in natural if i.kind == "stub_crash"]
    recoveries = [i.recovery_s for i in watchdog.incidents if i.recovered and i.recovery_s]
    errors = [o for o in done if o.error and o.error != "interrupted"]
    report = {
        "requests": len(done),
        "levels": levels,
        "max_tokens": args.max_tokens,
        "workaround": not args.no_workaround,
        "seconds": round(time.monotonic() - started, 1),
        "timed_out": time.monotonic() >= deadline,
        "errors": len(errors),
        "error_examples": sorted({(o.error or "")[:160] for o in errors})[:5],
        "stub_crashes": len(crashes),
        "crashes": [i.as_dict() for i in crashes],
        "other_incidents": [i.as_dict() for i in natural if i.kind != "stub_crash"],
        "injected_crashes": len([i for i in watchdog.incidents if i.pid in injected]),
        "recoveries": len(recoveries),
        "recovery_s_p95": stats.percentile(recoveries, 95),
        "recovery_s_max": max(recoveries) if recoveries else None,
        "resent_requests": len(resent),
        "not_healthy_lines": log.count("is not healthy"),
        "rss_mb": [(n, round(mb, 1)) for n, mb in rss],
        "rss_mb_per_1000_requests": slope_mb_per_1000(rss),
        "work_dir": str(work),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0 if not crashes and not errors else 1


if __name__ == "__main__":
    sys.exit(main())
