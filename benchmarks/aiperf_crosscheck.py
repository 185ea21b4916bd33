"""Cross-check trtspec's client timings with a peer client, NVIDIA's AIPerf,
and with a minimal client of no framework at all.

Runs three clients against the same OpenAI-compatible server, the same prompts
(a trtspec route file with ``prompt`` items, sent to ``/v1/completions`` by
all three), the same output length, temperature 0 and one request at a time:

* ``trtspec``: the benchmark's external-arm client (aiohttp, its own loop);
* ``aiperf``: ``aiperf profile`` (pinned ``AIPERF_PIN``), its worker and
  record-processor processes limited by ``--aiperf-workers`` and
  ``--aiperf-record-processors`` (AIPerf's ``--workers-max`` and
  ``--record-processors``; unset, it sizes both from the CPU count);
* ``minimal``: one stream at a time over ``http.client`` (:func:`minimal_stream`),
  wall clock read just before the request is written, at the first SSE event
  carrying text and at the last one — the floor any client adds.

The tools run interleaved, each round in a rotated order (every tool takes
every position equally often), so a load burst or a warm cache favours none.
Beside TTFT and end-to-end latency p50/p95 and the completion tokens each
tool saw, it prints where the CPU went during each tool's runs: the client's
own CPU time (this process for the in-process clients; AIPerf's process tree,
from ``RUSAGE_CHILDREN``) and the server's (``/proc/PID/stat``), per request
and as a share of the wall time. On a small machine a client whose processes
take CPU while the server generates slows the server itself: the server's
CPU per request stays the same while its wall time grows, and the minimal
client shows what the server does with the CPU to itself. ``--pin`` puts the
server on CPU 0 and the clients on CPU 1 to test exactly that.

AIPerf is heavy, so it lives in its own virtual environment,
``.cache/aiperf-venv`` (created on first use with ``pip install aiperf==PIN``).
The server is either one you name with ``--url`` (vLLM, trtllm-serve, …) or
``python -m trtspec.serve.openai_reference`` started here on ``--engine``.
Each tool gets its own warmup; the prompts should outnumber the reference
engine's prefix-cache entries (4) so no tool gets another's cache hits.

    python benchmarks/aiperf_crosscheck.py --engine engines/demo-cpu/target \\
        --prompts build_specs/routes/code_completion.jsonl --requests 20

Not part of ``make test``: a measurement, not a check (the minimal client's
parsing is unit-tested in tests/unit/test_aiperf_crosscheck.py)."""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
AIPERF_PIN = "0.13.0"
VENV = ROOT / ".cache" / "aiperf-venv"
TOOLS = ("trtspec", "aiperf", "minimal")
SEED = 1234


def ensure_aiperf(venv: Path = VENV) -> Path:
    exe = venv / "bin" / "aiperf"
    if exe.is_file():
        return exe
    print(f"installing aiperf=={AIPERF_PIN} into {venv} (once; a few minutes)", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"aiperf=={AIPERF_PIN}"], check=True
    )
    return exe


def start_server(engine: Path, mode: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trtspec.serve.openai_reference",
            "--engine",
            str(engine),
            "--mode",
            mode,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening on "):
            return proc, line.split()[-1]
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise SystemExit("openai_reference did not start")


def prompts_of(path: Path, n: int) -> list[str]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    texts = [it["prompt"] for it in items if it.get("prompt")]
    if not texts:
        raise SystemExit(
            f"{path}: no `prompt` items (chat items are rendered differently "
            "by the tools; use a completion route)"
        )
    return [texts[i % len(texts)] for i in range(n)]


# -- the minimal client --------------------------------------------------------


@dataclass
class StreamTiming:
    """One streamed completion as the minimal client saw it (perf_counter ns)."""

    send_ns: int
    first_byte_ns: int | None = None  # the status line's first byte
    first_text_ns: int | None = None  # the first event carrying text
    last_text_ns: int | None = None  # the last event carrying text
    done_ns: int | None = None  # the ``data: [DONE]`` event
    text: str = ""
    events: int = 0
    completion_tokens: int | None = None
    error: str | None = None

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_text_ns is None else (self.first_text_ns - self.send_ns) / 1e6

    @property
    def latency_ms(self) -> float | None:
        return None if self.last_text_ns is None else (self.last_text_ns - self.send_ns) / 1e6


@dataclass
class _Events:
    """Server-sent events out of a byte stream: lines end in LF, CRLF or CR, a
    blank line ends an event, ``data:`` lines accumulate (WHATWG)."""

    buffer: str = ""
    data: list[str] = field(default_factory=list)

    def feed(self, chunk: bytes) -> list[str]:
        self.buffer += chunk.decode("utf-8", errors="replace")
        out = []
        while True:
            cut = min(
                (i for i in (self.buffer.find("\r"), self.buffer.find("\n")) if i >= 0), default=-1
            )
            if cut < 0 or (self.buffer[cut] == "\r" and cut == len(self.buffer) - 1):
                return out  # no whole line yet (a final CR may be half of a CRLF)
            line = self.buffer[:cut]
            step = 2 if self.buffer.startswith("\r\n", cut) else 1
            self.buffer = self.buffer[cut + step :]
            if not line:
                if self.data:
                    out.append("\n".join(self.data))
                self.data = []
            elif line.startswith("data:"):
                value = line[5:]
                self.data.append(value[1:] if value.startswith(" ") else value)


def minimal_stream(url: str, body: dict, *, timeout_s: float = 120.0) -> StreamTiming:
    """POST ``body`` to ``url`` (``http://127.0.0.1:PORT/path``) over a fresh
    ``http.client`` connection and time the SSE answer: the clock is read once
    before the request is written and once as each read returns, nothing else
    in between (no event loop, no thread, no framework)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout_s)
    payload = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    timing = StreamTiming(send_ns=time.perf_counter_ns())
    try:
        conn.request("POST", parts.path or "/", payload, headers)
        resp = conn.getresponse()
        timing.first_byte_ns = time.perf_counter_ns()
        if resp.status != 200:
            timing.error = f"HTTP {resp.status}: {resp.read(500).decode(errors='replace')}"
            return timing
        events = _Events()
        while timing.done_ns is None:
            chunk = resp.read1(65536)
            now = time.perf_counter_ns()
            if not chunk:
                timing.error = f"stream ended without data: [DONE] after {timing.events} event(s)"
                return timing
            for data in events.feed(chunk):
                timing.events += 1
                if data.strip() == "[DONE]":
                    timing.done_ns = now
                    break
                obj = json.loads(data)
                if "error" in obj:
                    timing.error = f"server error event: {obj['error']}"
                    return timing
                if obj.get("usage"):
                    timing.completion_tokens = obj["usage"].get("completion_tokens")
                for choice in obj.get("choices") or []:
                    text = choice.get("text") or (choice.get("delta") or {}).get("content")
                    if text:
                        timing.text += text
                        timing.last_text_ns = now
                        if timing.first_text_ns is None:
                            timing.first_text_ns = now
    except (OSError, http.client.HTTPException, json.JSONDecodeError) as exc:
        timing.error = f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()
    return timing


@dataclass
class Samples:
    """One tool's measured (non-warmup) requests over all its runs."""

    ttft_ms: list[float] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    errors: int = 0
    busy_s: float = 0.0  # the sum of every request's latency, warmups included
    loop_lag_ms: list[float] = field(default_factory=list)  # AIPerf's own warnings
    runs: int = 0
    sent: int = 0  # requests sent, warmups included (the server's work)
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0


def run_minimal(
    url: str, model: str, prompts: list[str], *, max_tokens: int, warmup: int, samples: Samples
) -> None:
    target = url.rstrip("/") + "/v1/completions"
    for i, prompt in enumerate([*prompts[:warmup], *prompts]):
        body = {
            "model": model,
            "prompt": prompt,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
            "temperature": 0,
            "seed": SEED,
        }
        timing = minimal_stream(target, body)
        samples.sent += 1
        samples.busy_s += ((timing.done_ns or time.perf_counter_ns()) - timing.send_ns) / 1e9
        if i < warmup:
            continue
        if timing.error or timing.ttft_ms is None or timing.latency_ms is None:
            samples.errors += 1
            continue
        samples.ttft_ms.append(timing.ttft_ms)
        samples.latency_ms.append(timing.latency_ms)
        samples.tokens.append(timing.completion_tokens or 0)


def run_trtspec(
    url: str,
    model: str,
    prompts: list[str],
    *,
    max_tokens: int,
    warmup: int,
    out: Path,
    samples: Samples,
) -> None:
    from trtspec.bench.external import external_arms
    from trtspec.bench.records import read_requests
    from trtspec.bench.routes import RouteSet
    from trtspec.bench.runner import BenchOptions, BenchPlan, BenchSettings, run_benchmark

    route = RouteSet(
        "crosscheck",
        out / "prompts.jsonl",
        [{"prompt": p} for p in prompts],
        max_tokens,
        [],
        len(prompts),
    )
    settings = BenchSettings(
        concurrency=[1], temperatures=[0.0], warmup_requests=warmup, requests_per_route=len(prompts)
    )
    plan = BenchPlan(
        "crosscheck",
        None,
        None,
        [route],
        external_arms({"server": {"openai": url, "model": model}}),
        settings,
    )
    run_benchmark(plan, BenchOptions(output_dir=out / "trtspec", plots=False))
    rows = list(read_requests(out / "trtspec" / "requests.jsonl"))
    samples.sent += len(rows)
    for r in rows:
        samples.busy_s += (r["latency_ms"] or 0.0) / 1e3
        if r["warmup"]:
            continue
        if r["error"]:
            samples.errors += 1
            continue
        samples.ttft_ms.append(r["ttft_ms"])
        samples.latency_ms.append(r["latency_ms"])
        samples.tokens.append(r.get("completion_tokens") or 0)


def aiperf_argv(
    exe: Path,
    url: str,
    model: str,
    *,
    data: Path,
    requests: int,
    warmup: int,
    tokenizer: Path,
    out: Path,
    workers: int | None,
    record_processors: int | None,
    server_metrics: bool = True,
) -> list[str]:
    argv = [
        str(exe),
        "profile",
        "-m",
        model,
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--input-file",
        str(data),
        "--custom-dataset-type",
        "single_turn",
        "--dataset-sampling-strategy",
        "sequential",
        "--request-count",
        str(requests),
        "--warmup-request-count",
        str(warmup),
        "--concurrency",
        "1",
        "--tokenizer",
        str(tokenizer),
        "--use-server-token-count",
        "--extra-inputs",
        "temperature:0",
        "--extra-inputs",
        f"seed:{SEED}",
        "--output-artifact-dir",
        str(out),
        "--ui-type",
        "none",
        "--random-seed",
        str(SEED),
        "--no-auto-plot",
    ]
    # aiperf 0.13.0 config/flags/cli_config.py: --workers-max (default
    # min(concurrency, CPUs * 0.75 - 1)) and --record-processors (default
    # from the worker count)
    if workers is not None:
        argv += ["--workers-max", str(workers)]
    if record_processors is not None:
        argv += ["--record-processors", str(record_processors)]
    if not server_metrics:  # its server-metrics manager scrapes /metrics all run
        argv.append("--no-server-metrics")
    return argv


def run_aiperf(
    exe: Path,
    url: str,
    model: str,
    prompts: list[str],
    *,
    max_tokens: int,
    warmup: int,
    tokenizer: Path,
    out: Path,
    workers: int | None,
    record_processors: int | None,
    server_metrics: bool,
    samples: Samples,
) -> None:
    data = out / "aiperf_input.jsonl"
    # AIPerf's warmup takes the first entries of the sequential dataset; give it
    # the prompts the other tools warm up with, so the measured requests line up
    warm = [prompts[i % len(prompts)] for i in range(warmup)]
    data.write_text(
        "".join(json.dumps({"text": p, "output_length": max_tokens}) + "\n" for p in warm + prompts)
    )
    argv = aiperf_argv(
        exe,
        url,
        model,
        data=data,
        requests=len(prompts),
        warmup=warmup,
        tokenizer=tokenizer,
        out=out / "aiperf",
        workers=workers,
        record_processors=record_processors,
        server_metrics=server_metrics,
    )
    # AIPerf 0.13 in HF offline mode takes a local folder for a hub repo id
    # (HFValidationError); a local path needs no network without it.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    (out / "aiperf.log").write_text(proc.stdout + proc.stderr)
    # AIPerf's event-loop monitor: its worker's loop ran late by this much
    # (a response it timestamps while late is timestamped late)
    samples.loop_lag_ms += [
        float(m)
        for m in re.findall(
            r"taking too long to run\. Overhead: ([0-9.]+)ms", proc.stdout + proc.stderr
        )
    ]
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"aiperf exited {proc.returncode}:\n{tail}")
    records = out / "aiperf" / "profile_export.jsonl"
    if not records.is_file():
        raise SystemExit(f"aiperf wrote no {records}")
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        samples.sent += 1
        metrics = rec.get("metrics") or {}
        samples.busy_s += float((metrics.get("request_latency") or {}).get("value") or 0) / 1e3
        if rec["metadata"].get("benchmark_phase") == "warmup":
            continue
        if rec.get("error") or "time_to_first_token" not in metrics:
            samples.errors += 1
            continue
        samples.ttft_ms.append(float(metrics["time_to_first_token"]["value"]))
        samples.latency_ms.append(float(metrics["request_latency"]["value"]))
        osl = metrics.get("output_sequence_length") or {}
        samples.tokens.append(int(osl.get("value") or 0))


# -- CPU accounting ------------------------------------------------------------


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/PID/stat`` 14, 15)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def rotated_order(rounds: int) -> list[str]:
    """Each round the tools in turn, rotated by one: every tool runs first,
    second and third equally often over a multiple of three rounds."""
    order: list[str] = []
    for i in range(rounds):
        k = i % len(TOOLS)
        order += [*TOOLS[k:], *TOOLS[:k]]
    return order


def report(pooled: dict[str, Samples], cpus: int) -> list[str]:
    from trtspec.bench.stats import percentile

    lines = [f"{'metric (ms)':<16}" + "".join(f"{t:>10}" for t in TOOLS) + f"{'aiperf/min':>12}"]
    for name, attr, q in (
        ("ttft_p50", "ttft_ms", 50),
        ("ttft_p95", "ttft_ms", 95),
        ("latency_p50", "latency_ms", 50),
        ("latency_p95", "latency_ms", 95),
    ):
        values = {t: percentile(getattr(pooled[t], attr), q) or 0.0 for t in TOOLS}
        ratio = values["aiperf"] / values["minimal"] if values["minimal"] else 0.0
        lines.append(
            f"{name:<16}" + "".join(f"{values[t]:>10.2f}" for t in TOOLS) + f"{ratio:>11.2f}×"
        )

    def row(label: str, fn) -> str:  # type: ignore[no-untyped-def]
        return f"{label:<16}" + "".join(f"{fn(pooled[t]):>10}" for t in TOOLS)

    lines += [
        row("requests", lambda s: f"{len(s.ttft_ms)}"),
        row("errors", lambda s: f"{s.errors}"),
        row("tokens mean", lambda s: f"{sum(s.tokens) / max(1, len(s.tokens)):.1f}"),
        "",
        f"CPU during each tool's runs ({cpus} CPUs; warmups and tool start-up included)",
        row("wall s", lambda s: f"{s.wall_s:.1f}"),
        row("client CPU s", lambda s: f"{s.client_cpu_s:.1f}"),
        row("server CPU s", lambda s: f"{s.server_cpu_s:.1f}"),
        row("server CPU/req", lambda s: f"{1000 * s.server_cpu_s / max(1, s.sent):.0f}ms"),
        row("client CPU/wall", lambda s: f"{s.client_cpu_s / max(1e-9, s.wall_s):.2f}"),
        row("server CPU/wall", lambda s: f"{s.server_cpu_s / max(1e-9, s.wall_s):.2f}"),
        row("serving s", lambda s: f"{s.busy_s:.1f}"),
        row("server CPU/serv", lambda s: f"{s.server_cpu_s / max(1e-9, s.busy_s):.2f}"),
        row("loop lag warns", lambda s: f"{len(s.loop_lag_ms)}"),
        row("loop lag max ms", lambda s: f"{max(s.loop_lag_ms, default=0.0):.0f}"),
        "(serving s: the sum of request latencies, warmups included; server CPU/serv: the",
        " CPU share the server had while this tool's requests were in flight; loop lag:",
        " AIPerf's own 'event loop taking too long' warnings for its worker)",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="An OpenAI-compatible server to measure.")
    where.add_argument("--engine", type=Path, help="A reference engine folder to serve here.")
    parser.add_argument("--model", default="target", help="Served model name.")
    parser.add_argument(
        "--tokenizer", type=Path, help="Tokenizer folder for AIPerf (default ENGINE/tokenizer)."
    )
    parser.add_argument("--prompts", type=Path, required=True, help="A route .jsonl file.")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="Runs per tool, each round in a rotated order; samples are pooled.",
    )
    parser.add_argument(
        "--aiperf-workers",
        type=int,
        default=1,
        help="AIPerf's --workers-max (0 = AIPerf's own default from the CPU count).",
    )
    parser.add_argument(
        "--aiperf-record-processors",
        type=int,
        default=1,
        help="AIPerf's --record-processors (0 = AIPerf's own default).",
    )
    parser.add_argument(
        "--aiperf-no-server-metrics",
        action="store_true",
        help="Pass --no-server-metrics (AIPerf otherwise scrapes the server's /metrics).",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="Server on CPU 0, clients (this process and AIPerf) on CPU 1.",
    )
    parser.add_argument("--output", type=Path, help="Folder for every tool's artefacts.")
    args = parser.parse_args()
    tokenizer = args.tokenizer or (args.engine / "tokenizer" if args.engine else None)
    if tokenizer is None:
        parser.error("--tokenizer is required with --url")
    if args.pin and (args.url or len(os.sched_getaffinity(0)) < 2):
        parser.error("--pin needs --engine (a server started here) and at least 2 CPUs")
    exe = ensure_aiperf()
    prompts = prompts_of(args.prompts, args.requests)
    out = args.output or Path(tempfile.mkdtemp(prefix="aiperf-crosscheck-"))
    out.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if args.engine:
        server, url = start_server(args.engine, "none")
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and server is not None:
        os.sched_setaffinity(server.pid, {cpus[0]})
        os.sched_setaffinity(0, {cpus[1]})  # AIPerf inherits it
    pooled = {tool: Samples() for tool in TOOLS}
    order = rotated_order(args.rounds)
    load_before = os.getloadavg()
    workers = args.aiperf_workers or None
    processors = args.aiperf_record_processors or None
    try:
        for i, tool in enumerate(order):
            where = out / f"{i}-{tool}"
            where.mkdir()
            s = pooled[tool]
            server0 = process_cpu_s(server.pid) if server is not None else 0.0
            own0, kids0, wall0 = time.process_time(), children_cpu_s(), time.perf_counter()
            common = {"max_tokens": args.max_tokens, "warmup": args.warmup, "samples": s}
            if tool == "trtspec":
                run_trtspec(url, args.model, prompts, out=where, **common)
            elif tool == "minimal":
                run_minimal(url, args.model, prompts, **common)
            else:
                run_aiperf(
                    exe,
                    url,
                    args.model,
                    prompts,
                    tokenizer=tokenizer,
                    out=where,
                    workers=workers,
                    record_processors=processors,
                    server_metrics=not args.aiperf_no_server_metrics,
                    **common,
                )
            s.runs += 1
            s.wall_s += time.perf_counter() - wall0
            # in-process clients: this process; AIPerf: its reaped process tree
            s.client_cpu_s += time.process_time() - own0 + children_cpu_s() - kids0
            if server is not None:
                s.server_cpu_s += process_cpu_s(server.pid) - server0
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    lines = [
        f"server {url}, {len(prompts)} requests x {args.rounds} round(s) per tool "
        f"({' '.join(order)}), concurrency 1, max_tokens {args.max_tokens}, AIPerf "
        f"workers {workers or 'default'}, record processors {processors or 'default'}, "
        f"server metrics {'off' if args.aiperf_no_server_metrics else 'on'}"
        f"{', pinned: server CPU 0, clients CPU 1' if args.pin else ''}; artefacts in {out}",
        *report(pooled, len(cpus)),
        "machine load average (1, 5, 15 min) before "
        + ", ".join(f"{x:.1f}" for x in load_before)
        + ", after "
        + ", ".join(f"{x:.1f}" for x in os.getloadavg()),
    ]
    print("\n".join(lines))
    summary = {
        tool: {k: v for k, v in vars(s).items() if not isinstance(v, list)}
        | {"ttft_ms": s.ttft_ms, "latency_ms": s.latency_ms, "tokens": s.tokens}
        for tool, s in pooled.items()
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
