"""Cross-check trtspec's client timings with a peer client, NVIDIA's AIPerf.

Runs ``aiperf profile`` and trtspec's external-arm client against the same
OpenAI-compatible server, the same prompts (a trtspec route file with
``prompt`` items, sent to ``/v1/completions`` by both), the same output
length, temperature 0 and concurrency 1, then prints TTFT and end-to-end
latency p50/p95 side by side. The two clients should agree within a few
percent on TTFT p50; a larger gap means one of them measures something else
(or the machine is too busy to measure anything).

AIPerf is heavy, so it lives in its own virtual environment,
``.cache/aiperf-venv`` (created on first use with ``pip install aiperf==PIN``).
The server is either one you name with ``--url`` (vLLM, trtllm-serve, …) or
``python -m trtspec.serve.openai_reference`` started here on ``--engine``.
Each tool gets its own warmup; the prompts should outnumber the reference
engine's prefix-cache entries (4) so neither tool gets the other's cache hits.

    python benchmarks/aiperf_crosscheck.py --engine engines/demo-cpu/target \\
        --prompts build_specs/routes/code_completion.jsonl --requests 20

Not part of ``make test``: a measurement, not a check."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AIPERF_PIN = "0.13.0"
VENV = ROOT / ".cache" / "aiperf-venv"


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
            "by the two tools; use a completion route)"
        )
    return [texts[i % len(texts)] for i in range(n)]


def run_trtspec(
    url: str, model: str, prompts: list[str], *, max_tokens: int, warmup: int, out: Path
) -> tuple[list[float], list[float]]:
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
    run_benchmark(
        plan,
        BenchOptions(
            output_dir=out / "trtspec",
            plots=False,
        ),
    )
    rows = [
        r
        for r in read_requests(out / "trtspec" / "requests.jsonl")
        if not r["warmup"] and not r["error"]
    ]
    return [r["ttft_ms"] for r in rows], [r["latency_ms"] for r in rows]


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
) -> tuple[list[float], list[float]]:
    data = out / "aiperf_input.jsonl"
    # AIPerf's warmup takes the first entries of the sequential dataset; give it
    # the prompts trtspec warms up with, so the measured requests line up
    warm = [prompts[i % len(prompts)] for i in range(warmup)]
    data.write_text(
        "".join(json.dumps({"text": p, "output_length": max_tokens}) + "\n" for p in warm + prompts)
    )
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
        str(len(prompts)),
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
        "seed:1234",
        "--output-artifact-dir",
        str(out / "aiperf"),
        "--ui-type",
        "none",
        "--random-seed",
        "1234",
        "--no-auto-plot",
        "--workers-max",
        "1",
    ]
    # AIPerf 0.13 in HF offline mode takes a local folder for a hub repo id
    # (HFValidationError); a local path needs no network without it.
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise SystemExit(f"aiperf exited {proc.returncode}:\n{tail}")
    records = out / "aiperf" / "profile_export.jsonl"
    if not records.is_file():
        raise SystemExit(f"aiperf wrote no {records}")
    ttft, lat = [], []
    for line in records.read_text().splitlines():
        rec = json.loads(line)
        if rec["metadata"].get("benchmark_phase") == "warmup" or rec.get("error"):
            continue
        metrics = rec["metrics"]
        if "time_to_first_token" in metrics and "request_latency" in metrics:
            ttft.append(float(metrics["time_to_first_token"]["value"]))
            lat.append(float(metrics["request_latency"]["value"]))
    return ttft, lat


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
        default=2,
        help="Runs per tool, in ABBA order "
        "(trtspec, aiperf, aiperf, trtspec, ...); samples are pooled.",
    )
    parser.add_argument("--output", type=Path, help="Folder for both tools' artefacts.")
    args = parser.parse_args()
    tokenizer = args.tokenizer or (args.engine / "tokenizer" if args.engine else None)
    if tokenizer is None:
        parser.error("--tokenizer is required with --url")
    exe = ensure_aiperf()
    prompts = prompts_of(args.prompts, args.requests)
    out = args.output or Path(tempfile.mkdtemp(prefix="aiperf-crosscheck-"))
    out.mkdir(parents=True, exist_ok=True)
    server = None
    url = args.url
    if args.engine:
        server, url = start_server(args.engine, "none")
    pooled: dict[str, tuple[list[float], list[float]]] = {"trtspec": ([], []), "aiperf": ([], [])}
    order = []
    for i in range(args.rounds):
        order += ["trtspec", "aiperf"] if i % 2 == 0 else ["aiperf", "trtspec"]
    try:
        for i, tool in enumerate(order):
            where = out / f"{i}-{tool}"
            where.mkdir()
            if tool == "trtspec":
                ttft, lat = run_trtspec(
                    url,
                    args.model,
                    prompts,
                    max_tokens=args.max_tokens,
                    warmup=args.warmup,
                    out=where,
                )
            else:
                ttft, lat = run_aiperf(
                    exe,
                    url,
                    args.model,
                    prompts,
                    max_tokens=args.max_tokens,
                    warmup=args.warmup,
                    tokenizer=tokenizer,
                    out=where,
                )
            pooled[tool][0].extend(ttft)
            pooled[tool][1].extend(lat)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    from trtspec.bench.stats import percentile

    print(
        f"server {url}, {len(prompts)} requests x {args.rounds} round(s) per tool "
        f"({' '.join(order)}), concurrency 1, max_tokens {args.max_tokens}; "
        f"artefacts in {out}"
    )
    print(f"{'metric (ms)':<14}{'trtspec':>10}{'aiperf':>10}{'diff':>9}")
    for name, idx, q in (
        ("ttft_p50", 0, 50),
        ("ttft_p95", 0, 95),
        ("latency_p50", 1, 50),
        ("latency_p95", 1, 95),
    ):
        a, b = percentile(pooled["trtspec"][idx], q), percentile(pooled["aiperf"][idx], q)
        diff = f"{(a / b - 1) * 100:+.1f}%" if a is not None and b else "-"
        print(f"{name:<14}{a or 0:>10.2f}{b or 0:>10.2f}{diff:>9}")
    print(
        f"requests measured: trtspec {len(pooled['trtspec'][0])}, aiperf {len(pooled['aiperf'][0])}"
    )


if __name__ == "__main__":
    main()
