"""What trtspec's own serving path costs when the engine costs (almost) nothing.

Assembles a repository (``baseline``, a ``draft_model`` variant at k=3, an
``ngram`` variant, the router, the text models) whose engines are all the
instant engine (``trtspec.runtime.engine.instant_model`` through
``trtspec.bench.instant``), serves it with the real tritonserver for each
simulated step time (``--step-ms``: 0 = the ceiling, 8 = a GPU-like batch
step), and drives every layer in closed loop at each concurrency level
(``--levels``), one layer after another in the same run:

- ``engine``: the target engine model alone (client-side tokens, streaming);
- ``orch``: the ``baseline`` orchestrator (preprocessing, streamed engine,
  detokenizing);
- ``full``: the router as ``trtspec repo`` assembles it, the path a client of
  ``trtspec serve`` takes (it runs the variant's generation in its own
  process, ``in_process_variants``: router → engine);
- ``bls``: the router with ``in_process_variants: false`` (router →
  orchestrator model → engine, one hop more: the path before that cut);
- ``draft``, ``ngram``: the draft-loop orchestrators (per round: a draft call
  for ``draft``, a target verify call, detokenizing), with the cost per round;
- ``relay``: the floor of any Python router, not trtspec's: a bare decoupled
  Python model (``trtspec.bench.instant.RELAY_SOURCE``) that passes the
  engine layer's own tensors to the engine model over BLS and each response
  back, nothing else (no routing, text, rollout, deadline or cancel). What ``full`` adds
  over ``relay`` is trtspec's own router; what ``relay`` adds over
  ``engine`` is the platform's cost of one more Python stub in the path
  (engine flow only).

``--flow llmapi`` measures the LLM-API flow instead (a baseline-only ``flow:
llmapi`` repository whose ``baseline__llmapi`` model is the instant LLM,
``trtspec.runtime.engine.instant_llmapi``): ``engine`` is then that llmapi model alone
(its own tensors, text deltas), ``full`` the router as assembled (router →
llmapi model, the adapter in the router's process) and ``bls`` the router →
adapter model → llmapi model. ``--stream-intervals`` (e.g. ``1,4``) serves a
repository once per value, side by side in one run: the ``stream_interval``
LLM argument there, the spec's ``flow.stream_interval`` in the engine flow
(the orchestrators, and so the router, answer with a request's first tokens
and then once per N tokens; the engine alone still answers every step). There a
response carries text, so a request's tokens are its ``max_tokens`` (the
instant LLM never stops early; the texts of every layer are compared) and its
per-token latency is (last response − first) / (tokens − 1).

Per cell it prints responses/s, tokens/s, TTFT p50 and per-token latency
(gaps between responses over their tokens) p50/p99, each layer's TTFT and
per-token latency *added* over the engine alone, and CPU seconds per token
of the server's processes (all of them, and per model from the stubs'
command lines) and of this client. The tokens of every layer are compared to
the engine's (they must be identical: the instant engine is deterministic).
The budget of docs/design/serving.md is checked on the 8 ms step: at 64 in
flight the full path keeps at least 90% of the engine's tokens/s; at 1 in
flight it adds at most 1 ms to TTFT and 0.2 ms per token at p50.
``--check`` exits 3 when a budget line fails. ``--router-instances N``
serves the router as N processes (the spec's ``router.instances``): one
process's CPU per token caps what it relays, which a many-core GPU host
lifts this way. Every server runs under the stub watchdog, as ``trtspec
serve`` does (``--no-watchdog``: not): a stub that dies or freezes (the
2.51 deadlock of docs/design/triton-limits.md) is reported and the server
restarted; the requests that failed count as errors, the clients carry on
once it is ready, and the run ends with the incidents' count. Without it a
frozen router stalls the run for good.

Loopback only; each cell is bounded by ``--requests`` and ``--cell-seconds``
(a request whose next response takes over 60 s fails: no cell waits for good);
every server it starts is stopped before it exits. Run:
``.venv/bin/python benchmarks/ceiling.py [--step-ms 0,8] [--levels 1,8,32,64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens. "
LAYERS = {
    "engine": "target",
    "orch": "baseline",
    "full": "router",
    "draft": "draft",
    "ngram": "ngram",
    "bls": "router_bls",
    "relay": "relay",
}
# (no relay: a Python relay learns that a response was the last only when
# its BLS stream ends, and so answers with an empty final response, which
# tritonclient's asyncio client cannot ask for; the engine model's tensors
# carry the end, the llmapi model's do not)
LLMAPI_LAYERS = {"engine": "baseline__llmapi", "full": "router", "bls": "router_bls"}
# Layers that take the engine layer's own tensors (and answer with them).
ENGINE_CONTRACT = ("engine", "relay")


# A request's next response may take this long; then it fails and the cell
# goes on (--cell-seconds bounds only when new requests stop being sent).
RESPONSE_WAIT_S = 60.0
BUDGET_STEP_MS = 8.0
BUDGET_THROUGHPUT = 0.90  # full path tokens/s over the engine's at 64 in flight
BUDGET_TTFT_MS = 1.0  # added at p50, 1 in flight
BUDGET_TOKEN_MS = 0.2  # added per token at p50, 1 in flight
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Record:
    sent: float
    first: float = 0.0
    last: float = 0.0
    tokens: list[int] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # seconds per token, per response
    rounds: int = 0
    error: str = ""
    responses: int = 0  # with tokens or text
    text: str = ""  # the LLM-API flow: what streamed
    count: int = 0  # the LLM-API flow: tokens of a finished request

    @property
    def n(self) -> int:
        return self.count or len(self.tokens)

    @property
    def output(self) -> Any:
        return self.text if self.count else self.tokens


@dataclass
class Cell:
    step_ms: float
    layer: str
    level: int
    records: list[Record]
    wall_s: float
    server_cpu_s: float
    model_cpu_s: dict[str, float]
    client_cpu_s: float

    def ok(self) -> list[Record]:
        return [r for r in self.records if not r.error and r.n]

    @property
    def tokens(self) -> int:
        return sum(r.n for r in self.ok())


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# ---------------------------------------------------------------- CPU counters
def cpu_by_model(pgid: int) -> dict[str, float]:
    """CPU seconds so far of each process in the server's group, keyed by the
    model a Python stub serves (``tritonserver`` for the server itself)."""
    from trtspec.serve import group_members

    out: dict[str, float] = {}
    for pid in group_members(pgid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        seconds = (int(stat[11]) + int(stat[12])) / TICK
        name = "tritonserver"
        for arg in cmd:
            text = arg.decode(errors="replace")
            if text.endswith("model.py"):
                name = Path(text).parent.parent.name
                break
        out[name] = out.get(name, 0.0) + seconds
    return out


# ---------------------------------------------------------------- the client
def inputs_for(
    layer: str,
    prompt_ids: list[int],
    end_pad: tuple[int, int],
    max_tokens: int,
    flow: str = "engine",
) -> Any:
    import numpy as np
    import tritonclient.grpc.aio as grpcclient

    def tensor(name: str, value: Any, dtype: str) -> Any:
        array = np.asarray(value)
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    if flow == "llmapi" and layer == "engine":  # the llmapi model's own tensors
        inputs = [
            tensor("text_input", np.array([PROMPT.encode()], dtype=np.object_), "BYTES"),
            tensor("streaming", np.array([True]), "BOOL"),
            tensor("sampling_param_max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"),
            tensor("sampling_param_temperature", np.array([0.0], dtype=np.float32), "FP32"),
        ]
        outputs = ["text_output"]
    elif layer in ENGINE_CONTRACT:
        one = lambda v, dt, npdt: tensor(v[0], np.array([[v[1]]], dtype=npdt), dt)  # noqa: E731
        inputs = [
            tensor("input_ids", np.array([prompt_ids], dtype=np.int32), "INT32"),
            one(("input_lengths", len(prompt_ids)), "INT32", np.int32),
            one(("request_output_len", max_tokens), "INT32", np.int32),
            one(("streaming", True), "BOOL", np.bool_),
            one(("exclude_input_in_output", True), "BOOL", np.bool_),
            one(("end_id", end_pad[0]), "INT32", np.int32),
            one(("pad_id", end_pad[1]), "INT32", np.int32),
            one(("return_perf_metrics", True), "BOOL", np.bool_),
        ]
        outputs = ["output_ids", "sequence_length"]
    else:
        inputs = [
            tensor("text_input", np.array([PROMPT.encode()], dtype=np.object_), "BYTES"),
            tensor("max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"),
            tensor("stream", np.array([True]), "BOOL"),
            tensor("temperature", np.array([0.0], dtype=np.float32), "FP32"),
        ]
        outputs = ["output_ids", "is_final", "rounds"]
        if flow == "llmapi":
            outputs = ["text_output", "is_final"]
    return inputs, [grpcclient.InferRequestedOutput(n) for n in outputs]


@dataclass
class Load:
    """What a cell sends: to which server and layer, with which tensors."""

    url: str
    layer: str
    io: Any
    max_tokens: int
    flow: str = "engine"


async def worker(load: Load, budget: dict, records: list[Record]) -> None:
    import tritonclient.grpc.aio as grpcclient

    url, layer = load.url, load.layer
    inputs, outputs = load.io
    model = (LLMAPI_LAYERS if load.flow == "llmapi" else LAYERS)[layer]
    queue: asyncio.Queue = asyncio.Queue()

    async def requests(q: asyncio.Queue) -> Any:
        while True:
            item = await q.get()
            if item is None:
                return
            yield item

    client = grpcclient.InferenceServerClient(url)
    try:
        stream = client.stream_infer(requests(queue))
        while budget["left"] > 0 and time.perf_counter() < budget["deadline"]:
            budget["left"] -= 1
            rec = Record(sent=time.perf_counter())
            records.append(rec)
            await queue.put({"model_name": model, "inputs": inputs, "outputs": outputs})
            try:
                await read_one(stream, rec, load)
            except Exception as exc:  # the stream itself broke (--watchdog: a restart)
                rec.error = f"stream: {exc}"
                await queue.put(None)
                await client.close()
                client = grpcclient.InferenceServerClient(url)
                await wait_ready(client, budget["deadline"])
                queue = asyncio.Queue()
                stream = client.stream_infer(requests(queue))
                continue
            if rec.error:
                break
        await queue.put(None)
    finally:
        await client.close()


async def wait_ready(client: Any, deadline: float) -> None:
    """Until the (restarted) server is ready or ``deadline`` passed."""
    while time.perf_counter() < deadline + 120:
        with contextlib.suppress(Exception):
            if await client.is_server_ready():
                return
        await asyncio.sleep(0.2)


async def read_one(stream: Any, rec: Record, load: Load) -> None:
    """Read one request's responses off ``stream`` into ``rec``."""
    layer, max_tokens = load.layer, load.max_tokens
    while True:
        try:
            result, error = await asyncio.wait_for(stream.__anext__(), RESPONSE_WAIT_S)
        except asyncio.TimeoutError:
            # a model that stopped answering: the worker reconnects and goes on
            raise TimeoutError(f"no response for {RESPONSE_WAIT_S:g} s") from None
        now = time.perf_counter()
        if error is not None:
            rec.error = str(error)
            return
        if load.flow == "llmapi":
            if llmapi_response(rec, result, now, max_tokens, cumulative=layer == "engine"):
                return
            continue
        ids = result.as_numpy("output_ids")
        new = [] if ids is None else [int(t) for t in ids.reshape(-1)]
        if new:
            gap = now - (rec.last or rec.sent)
            if rec.first:
                rec.gaps.append(gap / len(new))
            else:
                rec.first = now
            rec.last = now
            rec.responses += 1
            rec.tokens.extend(new)
        if layer in ENGINE_CONTRACT:
            done = len(rec.tokens) >= max_tokens
        else:
            final = result.as_numpy("is_final")
            done = final is not None and bool(final.reshape(-1)[0])
            rounds = result.as_numpy("rounds")
            if done and rounds is not None:
                rec.rounds = int(rounds.reshape(-1)[0])
        if done:
            return


def llmapi_response(
    rec: Record, result: Any, now: float, max_tokens: int, *, cumulative: bool
) -> bool:
    """Take one LLM-API flow response into ``rec``; True when it was the last.
    ``cumulative``: the llmapi model's own stream, whose every ``text_output``
    is the whole text so far (upstream's ``CompletionOutput.text``); a response
    that adds nothing to it is not counted."""
    text = result.as_numpy("text_output")
    raw = b"" if text is None or not text.size else text.reshape(-1)[0]
    piece = raw.decode("utf-8", errors="replace")
    if cumulative:
        piece = piece[len(rec.text) :] if piece.startswith(rec.text) else ""
    if piece:
        rec.first = rec.first or now
        rec.last = now
        rec.responses += 1
        rec.text += piece
    params = result.get_response().parameters
    done = "triton_final_response" in params and params["triton_final_response"].bool_param
    if done and rec.first:
        rec.count = max_tokens  # the instant LLM never stops early
        if max_tokens > 1:
            rec.gaps.append((rec.last - rec.first) / (max_tokens - 1))
    return done


async def drive(load: Load, level: int, n: int, secs: float) -> list[Record]:
    records: list[Record] = []
    budget = {"left": n, "deadline": time.perf_counter() + secs}
    await asyncio.gather(*(worker(load, budget, records) for _ in range(level)))
    return records


def run_cell(server: Any, step_ms: float, load: Load, level: int, args: Any) -> Cell:
    pgid = server.pid
    before = cpu_by_model(pgid)
    client_before = time.process_time()
    started = time.perf_counter()
    requests = max(args.requests, 2 * level)
    records = asyncio.run(drive(load, level, requests, args.cell_seconds))
    wall = time.perf_counter() - started
    after = cpu_by_model(pgid)
    models = {k: after[k] - before.get(k, 0.0) for k in after}
    return Cell(
        step_ms,
        load.layer,
        level,
        records,
        wall,
        sum(models.values()),
        models,
        time.process_time() - client_before,
    )


# ---------------------------------------------------------------- reporting
def summarise(cell: Cell, engine: Cell | None) -> dict[str, Any]:
    ok = cell.ok()
    tokens = cell.tokens
    ttft = [(r.first - r.sent) * 1e3 for r in ok]
    gaps = [g * 1e3 for r in ok for g in r.gaps]
    row: dict[str, Any] = {
        "step_ms": cell.step_ms,
        "layer": cell.layer,
        "level": cell.level,
        "requests": len(ok),
        "errors": sum(1 for r in cell.records if r.error),
        "resp_s": sum(r.responses for r in ok) / cell.wall_s,
        "tok_s": tokens / cell.wall_s,
        "ttft_p50_ms": pct(ttft, 50),
        "tok_p50_ms": pct(gaps, 50),
        "tok_p99_ms": pct(gaps, 99),
        "server_cpu_ms_per_tok": 1e3 * cell.server_cpu_s / max(1, tokens),
        "client_cpu_ms_per_tok": 1e3 * cell.client_cpu_s / max(1, tokens),
        "cpu_ms_per_tok_by_model": {
            k: round(1e3 * v / max(1, tokens), 4) for k, v in cell.model_cpu_s.items() if v > 0
        },
    }
    rounds = sum(r.rounds for r in ok)
    if cell.layer in ("draft", "ngram") and rounds:
        # wall time of a request over its rounds, at this level
        row["ms_per_round"] = 1e3 * sum(r.last - r.sent for r in ok) / rounds
        row["tok_per_round"] = tokens / rounds
    if engine is not None and cell.layer != "engine":
        row["ttft_added_ms"] = row["ttft_p50_ms"] - summarise(engine, None)["ttft_p50_ms"]
        row["tok_added_ms"] = row["tok_p50_ms"] - summarise(engine, None)["tok_p50_ms"]
        row["tok_s_vs_engine"] = row["tok_s"] / max(1e-9, summarise(engine, None)["tok_s"])
        ref = engine.ok()[0].output if engine.ok() else None
        row["same_tokens"] = ref is not None and all(r.output == ref for r in ok)
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'step':>5} {'si':>2} {'layer':>6} {'conc':>4} {'reqs':>5} {'err':>3} {'resp/s':>8} "
        f"{'tok/s':>8} {'x eng':>6} {'ttft50':>7} {'+ttft':>7} {'tok50':>7} {'+tok50':>7} "
        f"{'tok99':>7} {'srvCPU':>7} {'cliCPU':>7} {'ms/rnd':>7} same"
    )
    print(head)
    for r in rows:
        print(
            f"{r['step_ms']:>5g} {r.get('stream_interval', 1):>2} {r['layer']:>6} "
            f"{r['level']:>4} {r['requests']:>5} "
            f"{r['errors']:>3} {r['resp_s']:>8.0f} {r['tok_s']:>8.0f} "
            f"{r.get('tok_s_vs_engine', 1.0):>6.2f} {r['ttft_p50_ms']:>7.2f} "
            f"{r.get('ttft_added_ms', 0.0):>7.2f} {r['tok_p50_ms']:>7.3f} "
            f"{r.get('tok_added_ms', 0.0):>7.3f} {r['tok_p99_ms']:>7.2f} "
            f"{r['server_cpu_ms_per_tok']:>7.3f} {r['client_cpu_ms_per_tok']:>7.3f} "
            f"{r.get('ms_per_round', float('nan')):>7.2f} {r.get('same_tokens', '-')}"
        )
    print(
        "  (ms; tok50/tok99: latency per token between responses; +: added over the engine "
        "alone; srvCPU/cliCPU: CPU ms per token of the server's processes / this client;\n"
        "   si: stream_interval, the LLM's (--flow llmapi) or the orchestrators' (engine flow))"
    )


def router_caps(rows: list[dict[str, Any]]) -> list[str]:
    """Per cell of the router layers at their highest level: the router
    process's CPU per token and the tokens/s at which that process alone
    would fill one core (1000 / ms per token)."""
    out = []
    for layer, model in (("full", "router"), ("bls", "router_bls")):
        cells = [r for r in rows if r["layer"] == layer]
        for step, si in sorted({(r["step_ms"], r.get("stream_interval", 1)) for r in cells}):
            top = max(
                (r for r in cells if (r["step_ms"], r.get("stream_interval", 1)) == (step, si)),
                key=lambda r: r["level"],
            )
            ms = top["cpu_ms_per_tok_by_model"].get(model)
            setting = f" si {si}"
            n = int(top.get("router_instances", 1))
            if ms:
                # the CPU of n processes, each carrying 1/n of the tokens; it
                # holds at this cell's tokens per response (a saturated router
                # coalesces what queued up: docs/design/serving.md)
                each = f" (its {n} processes' sum)" if n > 1 else ""
                per = top["tok_s"] / top["resp_s"] if top.get("resp_s") else None
                at = f", at {per:.1f} tokens a response" if per else ""
                out.append(
                    f"{step:g} ms{setting} {layer} x{top['level']}: {model} {ms:.3f} ms CPU per "
                    f"token{each}{at} -> at most ~{n * 1000 / ms:,.0f} tokens/s through "
                    f"{n if n > 1 else 'one'} {model} process{'es' if n > 1 else ''} "
                    f"(engine alone here: {engine_tok_s(rows, step, top['level'], si):,.0f})"
                )
    return out


def engine_tok_s(rows: list[dict[str, Any]], step: float, level: int, si: int = 1) -> float:
    for r in rows:
        if (
            r["layer"] == "engine"
            and r["step_ms"] == step
            and r["level"] == level
            and r.get("stream_interval", 1) == si
        ):
            return float(r["tok_s"])
    return float("nan")


def budget_lines(rows: list[dict[str, Any]], layer: str = "full") -> list[tuple[str, bool | None]]:
    def row(name: str, level: int) -> dict[str, Any] | None:
        for r in rows:
            if r["step_ms"] == BUDGET_STEP_MS and r["layer"] == name and r["level"] == level:
                return r
        return None

    lines: list[tuple[str, bool | None]] = []
    full64, full1 = row(layer, 64), row(layer, 1)
    if full64 is None:
        lines.append(
            (
                f"{layer} path tokens/s at 64 in flight >= {BUDGET_THROUGHPUT:.0%} of the "
                f"engine's ({BUDGET_STEP_MS:g} ms step): not measured",
                None,
            )
        )
    else:
        share = full64["tok_s_vs_engine"]
        lines.append(
            (
                f"{layer} path tokens/s at 64 in flight = {share:.1%} of the engine's "
                f"(budget >= {BUDGET_THROUGHPUT:.0%})",
                share >= BUDGET_THROUGHPUT,
            )
        )
    if full1 is None:
        lines.append((f"{layer} path TTFT / per-token added at 1 in flight: not measured", None))
    else:
        ttft, tok = full1["ttft_added_ms"], full1["tok_added_ms"]
        lines.append(
            (
                f"{layer} path TTFT added at p50, 1 in flight = {ttft:.2f} ms "
                f"(budget <= {BUDGET_TTFT_MS:g} ms)",
                ttft <= BUDGET_TTFT_MS,
            )
        )
        lines.append(
            (
                f"{layer} path per-token latency added at p50, 1 in flight = {tok:.3f} ms "
                f"(budget <= {BUDGET_TOKEN_MS:g} ms)",
                tok <= BUDGET_TOKEN_MS,
            )
        )
    return lines


def floor_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per step, interval and level where both ran: what the bare relay adds
    over the engine (one more Python stub: the platform's floor) and what the
    full path adds over the relay (trtspec's own router)."""
    lines = []
    for relay in rows:
        if relay["layer"] != "relay" or "ttft_added_ms" not in relay:
            continue
        key = (relay["step_ms"], relay.get("stream_interval", 1), relay["level"])
        full = next(
            (
                r
                for r in rows
                if r["layer"] == "full"
                and (r["step_ms"], r.get("stream_interval", 1), r["level"]) == key
                and "ttft_added_ms" in r
            ),
            None,
        )
        text = (
            f"{key[0]:g} ms si {key[1]} x{key[2]}: relay adds {relay['ttft_added_ms']:.2f} ms "
            f"TTFT, {relay['tok_added_ms']:.3f} ms a token, keeps {relay['tok_s_vs_engine']:.1%} "
            "of the engine's tokens/s"
        )
        if full is not None:
            text += (
                f"; the full path adds {full['ttft_added_ms'] - relay['ttft_added_ms']:.2f} ms "
                "TTFT over it (trtspec's router)"
            )
        lines.append(text)
    return lines


# ---------------------------------------------------------------- main
def tokenizer_folder(args: Any, root: Path) -> Path:
    if args.model:
        return Path(args.model)
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.tiny_model import train_tokenizer

    folder = root / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    train_tokenizer(folder)
    return folder


def add_watchdog_option(p: argparse.ArgumentParser) -> None:
    """``--watchdog`` / ``--no-watchdog`` (on by default); serving_path.py too."""
    p.add_argument(
        "--watchdog",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="watch each server's stubs as `trtspec serve` does (a dead or frozen stub: "
        "restart) and print every incident (default: on; off, a frozen stub stalls the run)",
    )


def watch(server: Any, incidents: list[str], out: Any = None) -> Any:
    """Put ``server`` under the stub watchdog; every incident is printed (to
    ``out``, default stdout) and its kind appended to ``incidents``. Returns
    what stops the watchdog."""
    from trtspec.serve import StubWatchdog

    def report(incident: Any) -> None:
        incidents.append(incident.kind)
        print(f"    incident: {incident.message()} ({incident.action})", file=out, flush=True)

    return StubWatchdog(server, on_incident=report).prime().start().stop


def incidents_line(incidents: list[str]) -> str:
    """The run's last word on the watchdog: how many incidents, by kind."""
    kinds = ", ".join(f"{k} {incidents.count(k)}" for k in sorted(set(incidents)))
    return f"watchdog: {len(incidents)} incident(s){': ' + kinds if kinds else ''}"


def parse_args(argv: list[str] | None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--step-ms", default="0,8", help="simulated engine step times (ms), comma list")
    p.add_argument("--levels", default="1,8,32,64", help="requests in flight, comma list")
    p.add_argument("--layers", default=",".join(LAYERS), help=f"subset of {','.join(LAYERS)}")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    p.add_argument("--requests", type=int, default=24, help="requests per cell (at least 2x level)")
    p.add_argument("--cell-seconds", type=float, default=8.0, help="stop sending after this")
    p.add_argument("--model", help="a Hugging Face folder for the tokenizer (default: tiny one)")
    p.add_argument("--json", type=Path, help="also write every row here")
    p.add_argument("--check", action="store_true", help="exit 3 when a budget line fails")
    p.add_argument(
        "--router-instances",
        type=int,
        default=1,
        help="router processes (the spec's router.instances; its layers' CPU is their sum)",
    )
    add_watchdog_option(p)
    p.add_argument(
        "--flow", choices=("engine", "llmapi"), default="engine", help="the serving flow measured"
    )
    p.add_argument(
        "--stream-intervals",
        default="1",
        help="stream_interval values, comma list (one server each): the LLM argument "
        "(--flow llmapi) or the spec's flow.stream_interval (engine flow: the orchestrators "
        "answer with the first tokens, then every N-th)",
    )
    return p.parse_args(argv)


def run_layers(
    server: Any, step: float, grid: tuple[list[str], list[int]], prompt: Any, args: Any
) -> list[dict[str, Any]]:
    """Every layer at every level on one server (a warm-up request first),
    each row summarised against the engine's cell at its level."""
    prompt_ids, end_pad = prompt
    layers, levels = grid
    rows = []
    cells: dict[tuple[str, int], Cell] = {}
    for level in levels:
        for layer in layers:
            io = inputs_for(layer, prompt_ids, end_pad, args.max_tokens, args.flow)
            load = Load(server.grpc_url, layer, io, args.max_tokens, args.flow)
            warm = argparse.Namespace(requests=1, cell_seconds=30)
            run_cell(server, step, load, 1, warm)
            cells[(layer, level)] = run_cell(server, step, load, level, args)
            rows.append(summarise(cells[(layer, level)], cells.get(("engine", level))))
            print(f"  {layer} x{level}: {rows[-1]['tok_s']:.0f} tok/s", flush=True)
            failed = [r.error for r in cells[(layer, level)].records if r.error]
            if failed:
                print(f"    {len(failed)} failed, the first: {failed[0][:300]}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    steps = [float(s) for s in args.step_ms.split(",") if s]
    levels = [int(s) for s in args.levels.split(",") if s]
    known = LLMAPI_LAYERS if args.flow == "llmapi" else LAYERS
    if args.flow == "llmapi" and args.layers == ",".join(LAYERS):
        args.layers = ",".join(LLMAPI_LAYERS)
    layers = [s for s in args.layers.split(",") if s]
    unknown = [s for s in layers if s not in known]
    if unknown:
        print(
            f"error: --layers: unknown layer {unknown[0]!r} for --flow {args.flow} "
            f"(known: {', '.join(known)})",
            file=sys.stderr,
        )
        return 2
    try:
        intervals = [int(s) for s in args.stream_intervals.split(",") if s]
    except ValueError:
        intervals = []
    if not intervals or min(intervals) < 1:
        print(
            f"error: --stream-intervals {args.stream_intervals!r}: give positive integers, "
            "e.g. 1,4",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.router_instances <= 32:
        print(f"error: --router-instances {args.router_instances}: give 1 to 32", file=sys.stderr)
        return 2
    layers = ["engine", *[s for s in layers if s != "engine"]]  # the reference for "added"
    from trtspec.bench.instant import add_relay, instant_llmapi_repository, instant_repository
    from trtspec.runtime.text import Tokenizer
    from trtspec.serve import Server

    rows: list[dict[str, Any]] = []
    incidents: list[str] = []  # the watchdog's, by kind
    with tempfile.TemporaryDirectory(prefix="trtspec-ceiling-") as tmp:
        root = Path(tmp)
        model = tokenizer_folder(args, root)
        if not (model / "config.json").is_file():
            (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
        tok = Tokenizer(model)
        prompt_ids = tok.encode(PROMPT)
        end_pad = (tok.end_id if tok.end_id is not None else -1, tok.pad_id or 0)
        print(f"load average before: {os.getloadavg()}", flush=True)
        batch = max(128, *levels)
        for step in steps:
            for interval in intervals:
                where = root / f"step{step:g}-si{interval}"
                if args.flow == "llmapi":
                    repo = instant_llmapi_repository(
                        where,
                        model,
                        step,
                        stream_interval=interval,
                        max_batch_size=batch,
                        router_instances=args.router_instances,
                    )
                else:
                    repo = instant_repository(
                        where,
                        model,
                        step,
                        max_batch_size=batch,
                        stream_interval=interval,
                        router_instances=args.router_instances,
                    )
                if "relay" in layers:
                    add_relay(repo, known["engine"])
                server = Server(repo, log_path=where.with_suffix(".log"))
                t0 = time.monotonic()
                server.start(timeout=300)
                setting = f" stream_interval {interval}"
                ready = time.monotonic() - t0
                print(f"step {step:g} ms{setting}: server ready in {ready:.1f} s", flush=True)
                unwatch = watch(server, incidents) if args.watchdog else None
                try:
                    rows += run_layers(server, step, (layers, levels), (prompt_ids, end_pad), args)
                finally:
                    if unwatch is not None:
                        unwatch()
                    server.stop()
                for row in rows:
                    row.setdefault("flow", args.flow)
                    row.setdefault("router_instances", args.router_instances)
                    row.setdefault("stream_interval", interval)
    print(f"load average after: {os.getloadavg()}")
    if args.watchdog:
        print(incidents_line(incidents))
    print()
    print_table(rows)
    print("\nCPU ms per token by model (server processes):")
    for r in rows:
        print(
            f"  {r['step_ms']:g} ms si {r.get('stream_interval', 1)} {r['layer']:>6} "
            f"x{r['level']:<3} {r['cpu_ms_per_tok_by_model']}"
        )
    print("\nthe router processes' ceiling (a stub is one Python process: on a many-core")
    print("GPU host it saturates one core while the engine does not):")
    for text in router_caps(rows):
        print(f"  {text}")
    floors = floor_lines(rows)
    if floors:
        print("\nthe floor of any Python router (relay: one bare Python stub, BLS to the engine):")
        for text in floors:
            print(f"  {text}")
    print("\nbudget (docs/design/serving.md):")
    failed = False
    for interval in intervals:
        group = [r for r in rows if r["stream_interval"] == interval]
        flow = "LLM-API flow" if args.flow == "llmapi" else "engine flow"
        print(f"  {flow}, stream_interval {interval}:")
        lines = [line for name in ("full", "bls") for line in budget_lines(group, name)]
        for text, met in lines:
            mark = "n/a " if met is None else ("MEETS" if met else "MISSES")
            failed = failed or met is False
            print(f"  [{mark}] {text}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 3 if (args.check and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
