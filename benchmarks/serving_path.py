"""A real engine through the whole server against the same engine alone, in one run.

Issue 24 items 4 and 5, measured side by side for each model (``--models``:
``demo`` = SmolLM2-135M-Instruct, the demo's model; ``tiny`` = the test
suite's tiny Llama), each built into a temporary folder as a baseline-only
reference repository (``trtspec.build.reference`` in process,
``trtspec.repo.assemble``) and served by the real tritonserver:

- ``in-process``: the reference engine loaded in this process as the
  engine model loads it and driven by the same in-flight batcher, one
  request at a time (item 4's reference);
- ``engine``: the engine model alone through the server (client-side token
  ids, streaming), at each level (item 5's reference at 4 in flight);
- ``relay``: a bare decoupled Python model in front of it, passing the
  engine's tensors over BLS and every response back (``trtspec.bench.instant``'s
  relay, as ``ceiling.py``'s): the floor any Python-backend router pays for
  its hop on this machine (``--no-relay``: not measured);
- ``orch``: the ``baseline`` orchestrator model (text in, text out);
- ``router``: the router as ``trtspec repo`` assembles it (the path a
  client of ``trtspec serve`` takes; the variant runs in its process).

Same prompts (three held-out chat prompts, ``benchmarks/reference_engine.py``'s),
greedy, ``--tokens`` new tokens; the ``orch`` and ``router`` clients ask for
``output_ids`` and ``is_final`` (a client of token ids, like the engine's;
``--text-client``: ``text_output`` too, as a chat client); every layer's token ids compared with the
in-process engine's (column ``same``; ``-`` when level 1, which measures that
reference, is not in ``--levels``). Tokens/s is completion tokens over wall
time (request sent to last token) summed over requests; at a level above 1 it
is the aggregate over the cell. Printed: the table, where the time goes at 1 in
flight (TTFT and decode time per token of each layer, and CPU seconds per
token of each server process and of the client, ``cores``: the CPU all of
them used over the cell's wall time, which near the machine's core count
says the cell measured who got the CPU), and the two checks: (4) the router's single
stream >= 90% of the in-process engine's tokens/s, (5) the router at 4 in
flight >= 80% of the engine model's at 4. ``--check`` exits 3 on a miss.

``--flow llmapi`` measures the LLM-API flow's path instead (a baseline-only
``flow: llmapi`` repository on the CPU stand-in): ``llm`` = the
``baseline__llmapi`` model alone (its own tensors, the whole text so far in
each response, read as what each adds), ``adapter`` =
the ``baseline`` adapter model in front of it, ``router`` = the router as
assembled (the adapter runs in its process: router → llm), ``bls`` = the
router calling the adapter model over BLS (router → adapter → llm, the path
before that cut). Tokens are the completion's text re-tokenized; every layer's
text is compared with the ``llm`` layer's.

Every server runs under the stub watchdog, as ``trtspec serve`` does
(``--no-watchdog``: not): a stub that dies or freezes (the 2.51 deadlock of
docs/design/triton-limits.md) is reported and the server restarted, the requests it
held count as errors, and the run goes on; the incidents are counted at the
end.

Loopback only; bounded by ``--tokens``, ``--repeats`` and the prompt set.
Run: ``.venv/bin/python benchmarks/serving_path.py [--models demo,tiny] [--flow llmapi]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests/fixtures (tiny model), benchmarks/ (prompts)
sys.path.insert(0, str(ROOT / "benchmarks"))

from ceiling import add_watchdog_option, incidents_line, watch  # noqa: E402

DEMO_MODEL = ROOT / ".cache" / "models" / "smollm2-135m-instruct"
SINGLE_STREAM_SHARE = 0.90  # item 4: router single stream over the engine in process
CONCURRENT_SHARE = 0.80  # item 5: router at 4 in flight over the engine model at 4
SPEC = """\
name: path-{name}
backend: reference
target: {{model: {model}, family: llama, dtype: float32, max_batch_size: 8,
         max_input_len: 1536, max_seq_len: 2048, max_num_tokens: 4096, instances: 1}}
variants: []
"""
TICK = os.sysconf("SC_CLK_TCK")
CLIENT = "client"  # the CPU of this process's threads during a served cell
# a bare Python model relaying the engine's tensors (trtspec.bench.instant.add_relay)
RELAY = "relay"
LLMAPI_SPEC = """\
name: llmapi-{name}
backend: reference
flow: {{kind: llmapi, trtllm_version: "1.2.1"}}
target: {{model: {model}, family: llama, dtype: float32, max_batch_size: 8,
         max_input_len: 1536, max_seq_len: 2048, max_num_tokens: 4096, instances: 1}}
variants: []
"""
LLMAPI_LAYERS = {"llm": "baseline__llmapi", "adapter": "baseline", "router": "router"}


@dataclass
class Run:
    """One request: what came back and when (perf_counter seconds)."""

    prompt: str
    sent: float
    first: float = 0.0
    last: float = 0.0
    ids: list[int] = field(default_factory=list)
    error: str = ""
    text: str = ""  # the LLM-API flow's layers: the streamed text


@dataclass
class Row:
    model: str
    layer: str
    level: int
    runs: list[Run]
    wall_s: float
    cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        return sum(len(r.ids) for r in self.runs if not r.error)

    def tok_s(self) -> float:
        if self.level == 1:  # one stream: its own time, requests back to back
            busy = sum(r.last - r.sent for r in self.runs if not r.error)
            return self.tokens / busy if busy > 0 else 0.0
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def ttft_ms(self) -> float:
        firsts = sorted((r.first - r.sent) * 1e3 for r in self.runs if not r.error)
        return firsts[len(firsts) // 2] if firsts else float("nan")

    def decode_ms(self) -> float:
        """Median time per token after the first, per request."""
        per = sorted(
            (r.last - r.first) * 1e3 / (len(r.ids) - 1)
            for r in self.runs
            if not r.error and len(r.ids) > 1
        )
        return per[len(per) // 2] if per else float("nan")


def build(model: Path, name: str, root: Path) -> tuple[Path, Path]:
    """A baseline-only repository for ``model`` under ``root``: (repo, engine)."""
    from tests.fixtures.every_mode import run_plan_steps

    from trtspec.plan import make_plan
    from trtspec.repo.assemble import assemble
    from trtspec.spec import load_spec

    spec_path = root / "spec.yaml"
    spec_path.write_text(SPEC.format(name=name, model=model.resolve()), encoding="utf-8")
    spec = load_spec(spec_path)
    plan = make_plan(spec, root / "engines")
    run_plan_steps(plan)
    repo = assemble(spec, plan, root / "engines", root / "triton_repo")
    return repo, root / "engines" / spec.name / "target"


def held_out_prompts(tokenizer_dir: Path) -> list[str]:
    """The prompts as ``text_input``: rendered with the model's chat template
    where it has one (as ``trtspec bench`` renders a chat route), else as is."""
    from reference_engine import PROMPTS

    from trtspec.bench.routes import load_tokenizer, render_prompt

    tokenizer = load_tokenizer(tokenizer_dir)
    if not getattr(tokenizer, "chat_template", None):
        return list(PROMPTS.values())
    return [
        render_prompt({"messages": [{"role": "user", "content": text}]}, tokenizer)
        for text in PROMPTS.values()
    ]


class InProcess:
    """The reference engine loaded in this process as the engine model loads
    it (thread count, KV reuse) and driven by the same in-flight batcher
    (``BatchScheduler``); every prompt seen once first (the served engine has
    seen them too: its prefix cache holds them)."""

    def __init__(self, engine_dir: Path, prompt_ids: list[list[int]], end_id: Any) -> None:
        from trtspec.runtime.engine import GenerationRequest, ReferenceEngine
        from trtspec.runtime.engine.batching import BatchScheduler
        from trtspec.runtime.engine.config import read_engine_config
        from trtspec.runtime.engine.decode import default_threads

        self.request = GenerationRequest
        self.end_id = end_id
        batch = read_engine_config(engine_dir).max_batch_size
        engine = ReferenceEngine.load(
            engine_dir, threads=default_threads(1), kv_reuse=max(4, 2 * batch)
        )
        self.scheduler = BatchScheduler(engine)
        for ids in prompt_ids:
            list(self.scheduler.submit(GenerationRequest(ids, 4, end_id=end_id)))

    def row(self, jobs: list[tuple[str, list[int]]], tokens: int) -> Row:
        """One request at a time, as a single stream."""
        runs = []
        started = time.perf_counter()
        for prompt, ids in jobs:
            run = Run(prompt, time.perf_counter())
            for delta in self.scheduler.submit(self.request(ids, tokens, end_id=self.end_id)):
                if delta and not run.first:
                    run.first = time.perf_counter()
                run.ids.extend(delta)
            run.last = time.perf_counter()
            if self.end_id in run.ids:  # as the orchestrator cuts it
                run.ids = run.ids[: run.ids.index(self.end_id)]
            runs.append(run)
        return Row("", "in-process", 1, runs, time.perf_counter() - started)

    def close(self) -> None:
        self.scheduler.close()


def _inputs(layer: str, prompt: str, ids: list[int], tokens: int, end_pad: tuple) -> tuple:
    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensor(name: str, array: Any, dtype: str) -> Any:
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    if layer == "engine":

        def one(name: str, value: Any, dtype: str, np_type: Any) -> Any:
            return tensor(name, np.array([[value]], dtype=np_type), dtype)

        inputs = [
            tensor("input_ids", np.array([ids], dtype=np.int32), "INT32"),
            one("input_lengths", len(ids), "INT32", np.int32),
            one("request_output_len", tokens, "INT32", np.int32),
            one("streaming", True, "BOOL", np.bool_),
            one("exclude_input_in_output", True, "BOOL", np.bool_),
            one("end_id", end_pad[0], "INT32", np.int32),
            one("pad_id", end_pad[1], "INT32", np.int32),
        ]
        return "target", inputs, ["output_ids", "sequence_length"]
    if layer == RELAY:  # the engine's own tensors, through the bare relay
        _, inputs, outputs = _inputs("engine", prompt, ids, tokens, end_pad)
        return RELAY, inputs, outputs
    inputs = [
        tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([tokens], dtype=np.int32), "INT32"),
        tensor("stream", np.array([True]), "BOOL"),
        tensor("temperature", np.array([0.0], dtype=np.float32), "FP32"),
    ]
    return ("baseline" if layer == "orch" else "router"), inputs, ["output_ids", "is_final"]


INCIDENTS: list[str] = []  # the watchdog's, by kind, over the whole run


def _open_stream(url: str) -> tuple[Any, Any]:
    """A gRPC client with its stream started, and the queue its (result,
    error, arrival time) triples land in."""
    import queue

    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(
        callback=lambda result, error: results.put((result, error, time.perf_counter()))
    )
    return client, results


def _next_result(results: Any, run: Run) -> tuple[Any, float] | None:
    """The stream's next (result, arrival time), or None with ``run.error``
    set (an error response, or nothing within 300 s)."""
    import queue

    try:
        result, error, at = results.get(timeout=300)
    except queue.Empty:
        run.error = "no response within 300 s"
        return None
    if error is not None:
        run.error = str(error)
        return None
    return result, at


def one_request(url: str, layer: str, prompt: str, ids: list[int], args: Any) -> Run:

    import tritonclient.grpc as grpcclient

    tokens, end_pad = args.tokens, args.end_pad
    model, inputs, outputs = _inputs(layer, prompt, ids, tokens, end_pad)
    engine_tensors = layer in ("engine", RELAY)  # the engine's own outputs
    if args.text_client and not engine_tensors:
        outputs = ["text_output", *outputs]
    client, results = _open_stream(url)
    run = Run(prompt, 0.0)
    try:
        run.sent = time.perf_counter()
        client.async_stream_infer(
            model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs]
        )
        while True:
            got = _next_result(results, run)
            if got is None:
                break
            result, at = got
            out = result.as_numpy("output_ids")
            if out is None:  # the relay's empty final response
                break
            new = [int(t) for t in out.reshape(-1)]
            if engine_tensors:
                length = int(result.as_numpy("sequence_length").reshape(-1)[0])
                new = new[:length]
            if new:
                run.first = run.first or at
                run.last = at
                run.ids.extend(new)
            if engine_tensors:
                done = len(run.ids) >= tokens or (new and new[-1] == end_pad[0]) or not new
            else:
                done = bool(result.as_numpy("is_final").reshape(-1)[0])
            if done:
                break
    finally:
        client.stop_stream()
        client.close()
    if engine_tensors and end_pad[0] in run.ids:  # the orchestrator cuts at the end id
        run.ids = run.ids[: run.ids.index(end_pad[0])]
    return run


def served(server: Any, layer: str, level: int, jobs: list[tuple[str, list[int]]], args) -> Row:
    from ceiling import cpu_by_model

    runs: list[Run] = []
    lock = threading.Lock()
    todo = list(jobs)

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                prompt, ids = todo.pop(0)
            if getattr(args, "flow", "engine") == "llmapi":
                run = llmapi_request(server.grpc_url, layer, prompt, args)
            else:
                run = one_request(server.grpc_url, layer, prompt, ids, args)
            with lock:
                runs.append(run)

    before = cpu_by_model(server.pid)
    client_before = time.process_time()  # this process: the client's threads
    started = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(level)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    after = cpu_by_model(server.pid)
    cpu = {k: after[k] - before.get(k, 0.0) for k in after if after[k] - before.get(k, 0.0) > 0}
    cpu[CLIENT] = time.process_time() - client_before
    return Row("", layer, level, runs, wall, cpu)


def measure(name: str, model: Path, root: Path, args: Any) -> list[Row]:
    from trtspec.runtime.text import Tokenizer
    from trtspec.serve import Server

    t0 = time.monotonic()
    repo, engine_dir = build(model, name, root)
    layers = ["engine", "orch", "router"]
    if args.relay:
        from trtspec.bench.instant import add_relay

        add_relay(repo, "target")
        layers.insert(1, RELAY)
    print(f"{name}: built in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    tok = Tokenizer(engine_dir / "tokenizer")
    prompts = held_out_prompts(engine_dir / "tokenizer")
    prompt_ids = [tok.encode(p) for p in prompts]
    end_id = tok.end_id
    args.end_pad = (end_id if end_id is not None else -1, tok.pad_id or 0)
    server = Server(repo, log_path=root / "tritonserver.log")
    t0 = time.monotonic()
    server.start(timeout=600)
    print(f"{name}: server ready in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    unwatch = watch(server, INCIDENTS, sys.stderr) if args.watchdog else (lambda: None)
    rows: list[Row] = []

    def note(row: Row) -> None:
        rows.append(row)
        print(f"  {name} {row.layer} x{row.level}: {row.tok_s():.1f} tok/s", file=sys.stderr)

    try:
        # the engine in process beside the idle server, its cells interleaved
        # with the served ones so the machine's load drifts over all of them
        local = InProcess(engine_dir, prompt_ids, end_id)
        jobs = list(zip(prompts, prompt_ids, strict=True))
        for layer in layers:
            served(server, layer, 1, jobs[:1], args)  # warm
        for level in args.levels:
            for _ in range(args.repeats):
                if level == 1:
                    note(local.row(jobs, args.tokens))
                for layer in layers:
                    note(served(server, layer, level, jobs * level, args))
        local.close()
    finally:
        unwatch()
        server.stop()
    for row in rows:
        row.model = name
    return rows


# ---------------------------------------------------------------- LLM-API flow
def build_llmapi(model: Path, name: str, root: Path) -> tuple[Path, Path]:
    """A baseline-only ``flow: llmapi`` repository for ``model`` under ``root``
    (built and assembled as ``trtspec build`` and ``repo`` do), plus the
    ``bls`` router: (repo, tokenizer folder)."""
    from trtspec.bench.instant import add_bls_router
    from trtspec.build.executor import backend_for, execute
    from trtspec.flows import flow_for, make_plan
    from trtspec.spec import load_spec

    spec_path = root / "spec.yaml"
    spec_path.write_text(LLMAPI_SPEC.format(name=name, model=model.resolve()), encoding="utf-8")
    spec = load_spec(spec_path)
    flow = flow_for(spec)
    engines = root / "engines"
    plan = make_plan(spec, engines)
    files = flow.files(spec, plan, engines)
    execute(plan, backend=backend_for(plan.backend))
    flow.write_files(files)
    repo = flow.assemble(spec, plan, engines, root / "triton_repo", routing=None, memory=None)
    add_bls_router(repo)
    return repo, spec.tokenizer_dir(engines)


def llmapi_request(url: str, layer: str, prompt: str, args: Any) -> Run:
    """One streaming request to an LLM-API flow layer; ``Run.text`` is what
    streamed, its first non-empty piece is the first token."""

    import numpy as np
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: Any, dtype: str, np_type: Any) -> Any:
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np_type))
        return t

    text = tensor("text_input", prompt.encode(), "BYTES", np.object_)
    if layer == "llm":
        inputs = [
            text,
            tensor("streaming", True, "BOOL", np.bool_),
            tensor("sampling_param_max_tokens", args.tokens, "INT32", np.int32),
            tensor("sampling_param_temperature", 0.0, "FP32", np.float32),
        ]
    else:
        inputs = [
            text,
            tensor("max_tokens", args.tokens, "INT32", np.int32),
            tensor("stream", True, "BOOL", np.bool_),
            tensor("temperature", 0.0, "FP32", np.float32),
        ]
    model = {"bls": "router_bls"}.get(layer, LLMAPI_LAYERS.get(layer, layer))
    client, results = _open_stream(url)
    run = Run(prompt, 0.0)
    try:
        run.sent = time.perf_counter()
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            got = _next_result(results, run)
            if got is None:
                break
            result, at = got
            response = result.get_response()
            if any(o.name == "text_output" for o in response.outputs):
                piece = result.as_numpy("text_output").reshape(-1)[0].decode()
                if layer == "llm":  # the llmapi model streams the whole text so far
                    piece = piece[len(run.text) :] if piece.startswith(run.text) else ""
                if piece:
                    run.first = run.first or at
                    run.last = at
                    run.text += piece
            if response.parameters["triton_final_response"].bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    run.ids = args.counter.encode(run.text)
    return run


def measure_llmapi(name: str, model: Path, root: Path, args: Any) -> list[Row]:
    from trtspec.runtime.text import Tokenizer
    from trtspec.serve import Server

    t0 = time.monotonic()
    repo, tokenizer_dir = build_llmapi(model, name, root)
    print(f"{name}: built in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    args.counter = Tokenizer(tokenizer_dir, add_special_tokens=False)
    prompts = held_out_prompts(tokenizer_dir)
    server = Server(repo, log_path=root / "tritonserver.log")
    server.start(timeout=600)
    unwatch = watch(server, INCIDENTS, sys.stderr) if args.watchdog else (lambda: None)
    layers = ("llm", "adapter", "router", "bls")
    rows: list[Row] = []
    try:
        for layer in layers:  # warm: every stub and the router's in-process adapter
            llmapi_request(server.grpc_url, layer, prompts[0], args)
        for level in args.levels:
            for _ in range(args.repeats):
                for layer in layers:
                    rows.append(
                        served(server, layer, level, [(p, []) for p in prompts] * level, args)
                    )
                    print(
                        f"  {name} {layer} x{level}: {rows[-1].tok_s():.1f} tok/s", file=sys.stderr
                    )
    finally:
        unwatch()
        server.stop()
    for row in rows:
        row.model = name
    return rows


def llmapi_lines(lines: list[dict[str, Any]]) -> list[str]:
    """What the adapter, the router and the router over BLS add to the llm
    model alone: TTFT at p50 and the share of its tokens/s, per level."""
    out = []
    for model in sorted({r["model"] for r in lines}):
        for level in sorted({r["level"] for r in lines if r["model"] == model}):
            cells = {r["layer"]: r for r in lines if (r["model"], r["level"]) == (model, level)}
            ref = cells.get("llm")
            if ref is None or not ref["tok_s"]:
                continue
            for layer in ("adapter", "router", "bls"):
                got = cells.get(layer)
                if got is None:
                    continue
                added = got["ttft_p50_ms"] - ref["ttft_p50_ms"]
                out.append(
                    f"{model} x{level} {layer:>7}: TTFT {added:+.1f} ms, "
                    f"tokens/s {got['tok_s'] / ref['tok_s']:.1%} of the llm model's"
                )
    return out


def same_as_reference(
    runs: list[Run], ref_ids: dict[tuple[str, str], list[int]], model: str
) -> bool | None:
    """Whether every answered run's ids are the reference's for its prompt;
    None when no run was answered or a prompt has no reference (the
    in-process layer runs only with level 1 in ``--levels``): unknown, not a
    match or a mismatch."""
    answered = [x for x in runs if not x.error]
    if not answered or any((model, x.prompt) not in ref_ids for x in answered):
        return None  # nothing answered (a crashed cell) or nothing to compare with
    return all(x.ids == ref_ids[(model, x.prompt)] for x in answered)


def summarise(rows: list[Row]) -> list[dict[str, Any]]:
    """One line per (model, layer, level): the repeats pooled."""
    out: list[dict[str, Any]] = []
    keys = sorted({(r.model, r.layer, r.level) for r in rows}, key=lambda k: (k[0], k[2]))
    ref_ids: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        if row.layer in ("in-process", "llm"):  # the LLM-API flow: the llm model's text
            for run in row.runs:
                if not run.error:
                    ref_ids[(row.model, run.prompt)] = run.ids
    for model, layer, level in keys:
        group = [r for r in rows if (r.model, r.layer, r.level) == (model, layer, level)]
        pooled = Row(model, layer, level, [x for r in group for x in r.runs], 0.0)
        pooled.wall_s = sum(r.wall_s for r in group)
        cpu: dict[str, float] = {}
        for r in group:
            for k, v in r.cpu_s.items():
                cpu[k] = cpu.get(k, 0.0) + v
        errors = [x.error for x in pooled.runs if x.error]
        same = same_as_reference(pooled.runs, ref_ids, model)
        out.append(
            {
                "model": model,
                "layer": layer,
                "level": level,
                "requests": len(pooled.runs),
                "errors": len(errors),
                "first_error": errors[0] if errors else None,
                "tokens": pooled.tokens,
                "tok_s": pooled.tok_s(),
                "ttft_p50_ms": pooled.ttft_ms(),
                "decode_p50_ms_per_tok": pooled.decode_ms(),
                "same_ids_as_in_process": same,
                # cores busy on average over the cell, server and client:
                # near the machine's count, the cell measured who gets the CPU
                "cores_busy": round(sum(cpu.values()) / pooled.wall_s, 2)
                if cpu and pooled.wall_s > 0
                else None,
                "cpu_ms_per_tok": {
                    k: round(1e3 * v / max(1, pooled.tokens), 2) for k, v in cpu.items()
                },
            }
        )
    return out


def _same(value: bool | None) -> str:
    return "-" if value is None else str(value)


def _tok_s(lines: list[dict[str, Any]], model: str, layer: str, level: int) -> float | None:
    """The summary line's tokens/s for (model, layer, level); None if not measured."""
    for r in lines:
        if (r["model"], r["layer"], r["level"]) == (model, layer, level):
            return r["tok_s"]
    return None


def checks(lines: list[dict[str, Any]]) -> list[tuple[str, bool | None]]:
    out: list[tuple[str, bool | None]] = []
    for model in sorted({r["model"] for r in lines}):
        ref, got = _tok_s(lines, model, "in-process", 1), _tok_s(lines, model, "router", 1)
        if ref and got is not None:
            share = got / ref
            out.append(
                (
                    f"(4) {model}: router single stream {got:.1f} tok/s = {share:.1%} of the "
                    f"engine in process ({ref:.1f}; target >= {SINGLE_STREAM_SHARE:.0%})",
                    share >= SINGLE_STREAM_SHARE,
                )
            )
        ref, got = _tok_s(lines, model, "engine", 4), _tok_s(lines, model, "router", 4)
        if ref and got is not None:
            share = got / ref
            out.append(
                (
                    f"(5) {model}: router at 4 in flight {got:.1f} tok/s = {share:.1%} of the "
                    f"engine model alone at 4 ({ref:.1f}; target >= {CONCURRENT_SHARE:.0%})",
                    share >= CONCURRENT_SHARE,
                )
            )
    return out


def floor_lines(lines: list[dict[str, Any]]) -> list[str]:
    """What the bare relay keeps of the same references as items 4 and 5
    (the floor of any Python-backend router in front of this engine), and
    what the router keeps of the relay's."""

    def tok_s(model: str, layer: str, level: int) -> float | None:
        return _tok_s(lines, model, layer, level) or None  # 0 tokens/s: nothing to divide by

    out = []
    for model in sorted({r["model"] for r in lines}):
        for item, ref_layer, level in (("4", "in-process", 1), ("5", "engine", 4)):
            ref, relay = tok_s(model, ref_layer, level), tok_s(model, RELAY, level)
            router = tok_s(model, "router", level)
            if ref is None or relay is None:
                continue
            text = (
                f"({item}) {model} x{level}: the bare relay keeps {relay / ref:.1%} of the "
                f"{'engine in process' if ref_layer == 'in-process' else 'engine model alone'}"
            )
            if router is not None:
                text += f"; the router keeps {router / relay:.1%} of the relay's tokens/s"
            out.append(text)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo,tiny", help="comma list of demo, tiny")
    p.add_argument("--demo-model", type=Path, default=DEMO_MODEL, help="the demo's HF folder")
    p.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    p.add_argument("--levels", default="1,4", help="requests in flight, comma list")
    p.add_argument("--repeats", type=int, default=2, help="cells per layer and level")
    p.add_argument("--json", type=Path, help="also write the lines here")
    p.add_argument("--check", action="store_true", help="exit 3 when a target is missed")
    p.add_argument(
        "--flow", choices=("engine", "llmapi"), default="engine", help="the serving flow measured"
    )
    p.add_argument(
        "--relay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure a bare Python relay in front of the engine model "
        "(engine flow): the floor of any Python router (default: on)",
    )
    p.add_argument(
        "--text-client",
        action="store_true",
        help="the orch and router clients also ask for text_output, as a chat "
        "client does (default: token ids and is_final, as the engine's client; "
        "the router then streams ids without decoding them, docs/design/orchestrator.md)",
    )
    add_watchdog_option(p)
    args = p.parse_args(argv)
    args.levels = [int(x) for x in args.levels.split(",") if x]
    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in ("demo", "tiny"):
            print(f"error: --models: unknown model {m!r} (known: demo, tiny)", file=sys.stderr)
            return 2
    if "demo" in models and not (args.demo_model / "config.json").is_file():
        print(
            f"error: --demo-model: {args.demo_model / 'config.json'} not found; "
            "run `make demo` once (it writes the model folder) or pass --demo-model DIR",
            file=sys.stderr,
        )
        return 1
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="trtspec-path-") as tmp:
        for name in models:
            root = Path(tmp) / name
            root.mkdir()
            if name == "tiny":
                from tests.fixtures.tiny_model import make_tiny_llama

                model = make_tiny_llama(root / "tiny-llama")
            else:
                model = args.demo_model
            rows += (measure_llmapi if args.flow == "llmapi" else measure)(name, model, root, args)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    if args.watchdog:
        print(incidents_line(INCIDENTS), file=sys.stderr)
    lines = summarise(rows)
    print(
        f"{'model':>5} {'layer':>10} {'conc':>4} {'reqs':>4} {'err':>3} {'tokens':>6} "
        f"{'tok/s':>7} {'ttft50':>7} {'ms/tok':>7} same cores  CPU ms/token by process"
    )
    for r in lines:
        print(
            f"{r['model']:>5} {r['layer']:>10} {r['level']:>4} {r['requests']:>4} "
            f"{r['errors']:>3} {r['tokens']:>6} {r['tok_s']:>7.1f} {r['ttft_p50_ms']:>7.1f} "
            f"{r['decode_p50_ms_per_tok']:>7.2f} {_same(r['same_ids_as_in_process']):>5} "
            f"{'-' if r['cores_busy'] is None else format(r['cores_busy'], '.2f'):>5}  "
            f"{r['cpu_ms_per_tok']}"
        )
        if r["first_error"]:
            print(f"      first error: {r['first_error']}")
    if args.flow == "llmapi":
        print("\nLLM-API flow: each layer over the llm model alone (same level):")
        for text in llmapi_lines(lines):
            print(f"  {text}")
    floors = floor_lines(lines)
    if floors:
        print("\nthe floor of any Python router (relay: one bare Python stub, BLS to the engine):")
        for text in floors:
            print(f"  {text}")
    print("\ntargets (issue 24 items 4 and 5):")
    failed = False
    for text, met in checks(lines):
        failed = failed or met is False
        print(f"  [{'MEETS' if met else 'MISSES'}] {text}")
    if args.json:
        args.json.write_text(json.dumps(lines, indent=2) + "\n")
    return 3 if (args.check and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
