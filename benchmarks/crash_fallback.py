"""What a crashed speculative variant costs its clients: a stub killed under
load, with the watchdog either restarting the whole server (``restart``, the
policy before issue 28) or leaving the variant down while the router serves
its routes from their fallback (``fallback``, what ``trtspec serve`` does now).

It builds the soak repository of ``benchmarks/soak_stubs.py`` (tiny random
Llama; baseline, ``ngram`` and ``lookahead`` variants, route ``code`` →
ngram with fallback baseline), serves it under the real tritonserver, and per
policy runs ``--concurrency`` closed-loop clients (4 by default), each
sending streamed requests through the router on route ``code`` and sending
the next one as soon as one ends (after ``--retry-pause-s`` when it
failed), as a client's retry loop would. After ``--warmup-s`` it SIGKILLs the stub of
``--victim`` (default ``ngram_0_0``, the variant's orchestrator), keeps the
load for ``--after-s`` more seconds, then waits for the requests in flight.

Reported per policy: requests before the kill; requests in flight at the
kill and how they ended; requests sent after the kill — how many, how many
failed (the issue's "failed attempts per crash"), how many were served by
the fallback — and the p50 latency before and after. Loopback only; bounded
by the durations given and ``--request-timeout``; everything it starts is
stopped before it exits.

Run: ``.venv/bin/python benchmarks/crash_fallback.py [--policy restart fallback]
[--json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import soak_stubs  # noqa: E402  (the repository builder, after the path is set)

from trtspec.serve import Server, StubWatchdog, fallback_covered, stubs_of  # noqa: E402

PROMPT = soak_stubs.PROMPTS[0][1]  # route "code"


def one_request(url: str, max_tokens: int, timeout: float) -> dict[str, Any]:
    """One streamed request through the router; when and how it ended."""
    import tritonclient.grpc as grpcclient

    sent = time.monotonic()
    results: queue.Queue = queue.Queue()
    out: dict[str, Any] = {"sent": sent, "error": None, "variant": None, "fallback": None}
    client = None
    try:
        client = grpcclient.InferenceServerClient(url)
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        inputs = []
        for name, value, dtype in (
            ("text_input", np.array([PROMPT.encode()], dtype=np.object_), "BYTES"),
            ("max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"),
            ("route", np.array([b"code"], dtype=np.object_), "BYTES"),
            ("stream", np.array([True]), "BOOL"),
        ):
            tensor = grpcclient.InferInput(name, [1], dtype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.async_stream_infer("router", inputs)
        deadline = sent + timeout
        while True:
            try:
                result, error = results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                out["error"] = f"no answer within {timeout:g} s"
                break
            if error is not None:
                out["error"] = str(error)[:200]
                break
            if bool(result.as_numpy("is_final")[0]):
                out["variant"] = result.as_numpy("variant")[0].decode()
                out["fallback"] = bool(result.as_numpy("fallback")[0])
                break
    except Exception as exc:  # connection refused during a restart, …
        out["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    finally:
        if client is not None:
            try:
                # cancel: a request still waiting must not block the stream's close
                client.stop_stream(cancel_requests=out["error"] is not None)
                client.close()
            except Exception:
                pass
    out["ended"] = time.monotonic()
    return out


def run_policy(repo: Path, policy: str, args: argparse.Namespace, log: Path) -> dict[str, Any]:
    server = Server(repo, log_path=log)
    server.start(timeout=600)
    covered = fallback_covered(repo) if policy == "fallback" else {}
    incidents: list[Any] = []
    watchdog = StubWatchdog(server, fallback=covered, on_incident=incidents.append)
    watchdog.prime().start()
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            row = one_request(server.grpc_url, args.max_tokens, args.request_timeout)
            with lock:
                rows.append(row)
            if row["error"] is not None:
                time.sleep(args.retry_pause_s)  # a client's pause before it tries again

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(args.concurrency)]
    try:
        for t in threads:
            t.start()
        time.sleep(args.warmup_s)
        victim = next(
            (p for p, s in stubs_of(server.pid or 0).items() if s.instance == args.victim), None
        )
        if victim is None:
            raise SystemExit(f"no stub named {args.victim} under the server")
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        time.sleep(args.after_s)
        stop.set()
        for t in threads:
            t.join(timeout=args.request_timeout + 30)
    finally:
        watchdog.stop()
        server.stop()
    before = [r for r in rows if r["ended"] <= killed]
    in_flight = [r for r in rows if r["sent"] < killed < r["ended"]]
    after = [r for r in rows if r["sent"] >= killed]

    def p50(sample: list[dict[str, Any]]) -> float | None:
        ok = [r["ended"] - r["sent"] for r in sample if r["error"] is None]
        return round(statistics.median(ok), 3) if ok else None

    return {
        "policy": policy,
        "victim": args.victim,
        "covered_models": covered,
        "incidents": [i.as_dict() for i in incidents],
        "before": {"requests": len(before), "failed": sum(r["error"] is not None for r in before)},
        "in_flight_at_kill": {
            "requests": len(in_flight),
            "failed": sum(r["error"] is not None for r in in_flight),
            "seconds_to_end": sorted(round(r["ended"] - killed, 1) for r in in_flight),
            "errors": sorted({r["error"] for r in in_flight if r["error"]}),
        },
        "sent_after_kill": {
            "requests": len(after),
            "failed": sum(r["error"] is not None for r in after),
            "served_by_fallback": sum(bool(r["fallback"]) for r in after),
            "served_by_variant": {
                v: sum(r["variant"] == v for r in after)
                for v in sorted({r["variant"] for r in after if r["variant"]})
            },
            "errors": sorted({r["error"] for r in after if r["error"]})[:5],
        },
        "p50_s_before": p50(before),
        "p50_s_after": p50(after),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", nargs="+", default=["restart", "fallback"])
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--warmup-s", type=float, default=10.0)
    ap.add_argument("--after-s", type=float, default=60.0)
    ap.add_argument("--retry-pause-s", type=float, default=0.25)
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument("--victim", default="ngram_0_0")
    ap.add_argument("--work-dir", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="trtspec-crash-"))
    work.mkdir(parents=True, exist_ok=True)
    repo = work / "triton_repo" / "soak"
    if not (repo / "trtspec-repo.json").is_file():
        repo = soak_stubs.build_repo(work)
    results = []
    for policy in args.policy:
        result = run_policy(repo, policy, args, work / f"tritonserver-{policy}.log")
        results.append(result)
        print(json.dumps(result, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
