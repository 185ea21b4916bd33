"""A small OpenAI-compatible server in front of a reference engine folder, so
external arms can be tested and demonstrated where no vLLM runs (no GPU, no
CPU vLLM wheel).

It is a real HTTP server (aiohttp) on 127.0.0.1 by default and speaks the
subset of vLLM's API the benchmark and peer clients use: ``GET /v1/models``,
``GET /health``, ``POST /v1/chat/completions`` and ``POST /v1/completions``
(streamed as server-sent events in vLLM's chunk format — a role chunk, content
deltas, the finish reason, a usage-only chunk when ``stream_options.
include_usage`` is set, then ``data: [DONE]`` — or answered whole), and
``GET /metrics`` in Prometheus text format with vLLM's names, including the
spec-decode counters ``vllm:spec_decode_num_drafts_total``,
``…_num_draft_tokens_total``, ``…_num_accepted_tokens_total`` and
``…_num_accepted_tokens_per_pos_total{position}`` that ``--mode ngram``
(prompt lookup, vLLM's ``ngram`` method) increments; ``--mode none`` serves
the target alone and, like vLLM without a speculative config, has no such
counters. Chat requests are rendered with the tokenizer's own chat template.

Generation runs on one engine thread, one engine step at a time, so requests
in flight interleave per step and the event loop stays free for ``/metrics``.

    python -m trtspec.serve.openai_reference --engine engines/demo/target_dte --mode ngram

prints ``listening on http://127.0.0.1:PORT`` once it accepts connections
(``--port 0`` picks a free port)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.runtime.speculate import accepted_count, draft_budget, propose_ngram, round_finished
from trtspec.runtime.text import IncrementalText, Tokenizer

MODES = ("none", "ngram")


@dataclass
class SpecCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    per_position: list[int] = field(default_factory=list)


@dataclass
class ServerState:
    engine: Any
    tokenizer: Tokenizer
    tokenizer_dir: Path
    model_name: str
    mode: str
    num_draft_tokens: int
    max_matching_ngram_size: int
    spec: SpecCounters
    prompt_tokens: int = 0
    generation_tokens: int = 0
    running: int = 0
    requests: int = 0
    chat_tokenizer: Any = None
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1))


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def error_body(message: str, kind: str, status: int) -> dict[str, Any]:
    """vLLM's error object (``ErrorResponse(error=ErrorInfo(...))``)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


# -- generation (engine thread) ------------------------------------------------------------


def _steps(
    state: ServerState,
    prompt: list[int],
    max_tokens: int,
    sampling: Any,
    *,
    end_id: int | None,
    min_tokens: int,
) -> Iterator[list[int]]:
    """Token deltas of one request; ``ngram`` runs the prompt-lookup draft →
    verify loop (one engine verification step per round) and counts drafts
    the way vLLM's ``SpecDecodingStats.observe_draft`` does."""
    from trtspec.runtime.engine import GenerationRequest

    engine = state.engine
    if state.mode == "none":
        gen = engine.stream(
            GenerationRequest(prompt, max_tokens, end_id, sampling, min_tokens=min_tokens)
        )
        yield from gen
        return
    sequence, produced = list(prompt), 0
    max_draft = engine.config.max_draft_len
    while produced < max_tokens:
        remaining = max_tokens - produced
        k = draft_budget(state.num_draft_tokens, max_draft, remaining)
        draft = propose_ngram(sequence, k, state.max_matching_ngram_size) if k else []
        gen = engine.generate(
            GenerationRequest(
                sequence,
                len(draft) + 1,
                end_id,
                sampling,
                draft_ids=draft or None,
                min_tokens=max(0, min_tokens - produced),
            )
        )
        verified = list(gen.output_ids)
        accepted = min(accepted_count(draft, verified), len(draft))
        if draft:
            spec = state.spec
            spec.drafts += 1
            spec.draft_tokens += len(draft)
            spec.accepted_tokens += accepted
            for pos in range(accepted):
                spec.per_position[pos] += 1
        kept = verified[:remaining]
        if end_id is not None and end_id in kept:
            kept = kept[: kept.index(end_id)]
        sequence.extend(kept)
        produced += len(kept)
        if kept:
            yield kept
        if round_finished(draft, verified, end_id):
            return


def _prompt_ids(state: ServerState, body: dict[str, Any], chat: bool) -> list[int]:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages: a non-empty list is required")
        if state.chat_tokenizer is None:
            from transformers import AutoTokenizer

            state.chat_tokenizer = AutoTokenizer.from_pretrained(str(state.tokenizer_dir))
        text = state.chat_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return state.tokenizer.encode(str(text))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise BadRequest("prompt: a non-empty string is required")
    return state.tokenizer.encode(prompt)


def _sampling(body: dict[str, Any]) -> Any:
    from trtspec.runtime.engine import SamplingParams

    def number(name: str, default: float) -> float:
        value = body.get(name, default)
        if value is None:
            return default
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise BadRequest(f"{name}: must be a number, got {value!r}")
        return float(value)

    top_k = int(number("top_k", 0))
    return SamplingParams(
        temperature=number("temperature", 1.0),
        top_k=max(0, top_k),
        top_p=number("top_p", 1.0),
        seed=int(number("seed", 0)),
    )


# -- HTTP ------------------------------------------------------------------------------------


def _chunk(
    kind: str,
    rid: str,
    model: str,
    created: int,
    *,
    text: str | None = None,
    role: str | None = None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> bytes:
    if usage is not None:
        choices: list[dict[str, Any]] = []
    elif kind == "chat":
        delta: dict[str, Any] = {}
        if role is not None:
            delta["role"] = role
        if text is not None:
            delta["content"] = text
        choices = [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
    else:
        choices = [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]
    obj: dict[str, Any] = {
        "id": rid,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        obj["usage"] = usage
    return f"data: {json.dumps(obj)}\n\n".encode()


async def completions(request: Any) -> Any:
    from aiohttp import web

    state: ServerState = request.app["state"]
    chat = request.path.endswith("/chat/completions")
    kind = "chat" if chat else "completions"
    try:
        body = await request.json()
    except json.JSONDecodeError:
        return web.json_response(
            error_body("request body is not JSON", "BadRequestError", 400), status=400
        )
    try:
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        if body.get("model") not in (None, state.model_name):
            raise BadRequest(
                f"The model `{body.get('model')}` does not exist.", 404, "NotFoundError"
            )
        loop = asyncio.get_running_loop()
        prompt = await loop.run_in_executor(state.pool, _prompt_ids, state, body, chat)
        config = state.engine.config
        limit = config.max_input_len if state.mode == "ngram" else config.max_seq_len
        max_tokens = next(
            (body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None),
            max(1, limit - len(prompt)),
        )
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise BadRequest(f"max_tokens: must be a positive integer, got {max_tokens!r}")
        max_input = config.max_input_len
        if state.mode == "ngram" and len(prompt) + max_tokens > max_input:
            # the draft loop resends prompt + output every round
            raise BadRequest(
                f"Prompt length + max_tokens ({len(prompt)} + {max_tokens}) exceeds "
                f"maximum input length ({max_input}) of the prompt-lookup loop, "
                "which resends prompt + output every round."
            )
        sampling = _sampling(body)
        end_id = None if body.get("ignore_eos") else state.tokenizer.end_id
        steps = _steps(
            state,
            prompt,
            max_tokens,
            sampling,
            end_id=end_id,
            min_tokens=int(body.get("min_tokens") or 0),
        )
        first = await loop.run_in_executor(state.pool, _next, steps)  # validates the request
    except BadRequest as exc:
        return web.json_response(error_body(str(exc), exc.kind, exc.status), status=exc.status)
    except Exception as exc:  # the engine's RequestError and friends: the client's fault
        return web.json_response(error_body(str(exc), "BadRequestError", 400), status=400)
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    text = IncrementalText(state.tokenizer.decode)
    state.running += 1
    state.requests += 1
    state.prompt_tokens += len(prompt)
    try:
        if body.get("stream"):
            reply = _Reply(kind, rid, created, len(prompt), text)
            return await _stream(request, state, reply, steps, first=first, body=body)
        ids: list[int] = []
        delta = first
        try:
            while delta is not None:
                ids.extend(delta)
                delta = await loop.run_in_executor(state.pool, _next, steps)
        except Exception as exc:  # failed mid-generation: the server's fault, as in vLLM
            return web.json_response(error_body(str(exc), "InternalServerError", 500), status=500)
        state.generation_tokens += len(ids)
        text.ids.extend(ids)
        content = text.flush()
        finish = "length" if len(ids) >= max_tokens else "stop"
        choice: dict[str, Any] = (
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
            if chat
            else {"index": 0, "text": content, "finish_reason": finish}
        )
        return web.json_response(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": created,
                "model": state.model_name,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": len(ids),
                    "total_tokens": len(prompt) + len(ids),
                },
            }
        )
    finally:
        state.running -= 1


def _next(steps: Iterator[list[int]]) -> list[int] | None:
    return next(steps, None)


@dataclass
class _Reply:
    """One streamed answer's fixed parts."""

    kind: str  # chat | completions
    rid: str
    created: int
    n_prompt: int
    text: IncrementalText


async def _stream(
    request: Any,
    state: ServerState,
    reply: _Reply,
    steps: Iterator[list[int]],
    *,
    first: list[int] | None,
    body: dict[str, Any],
) -> Any:
    from aiohttp import web

    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    model, loop = state.model_name, asyncio.get_running_loop()
    kind, rid, created, text, n_prompt = (
        reply.kind,
        reply.rid,
        reply.created,
        reply.text,
        reply.n_prompt,
    )
    if kind == "chat":
        await resp.write(_chunk(kind, rid, model, created, role="assistant", text=""))
    produced, delta = 0, first
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    try:
        while delta is not None:
            produced += len(delta)
            state.generation_tokens += len(delta)
            piece = text.push(delta)
            if piece:
                await resp.write(_chunk(kind, rid, model, created, text=piece))
            delta = await loop.run_in_executor(state.pool, _next, steps)
        finish = "length" if max_tokens and produced >= max_tokens else "stop"
        await resp.write(_chunk(kind, rid, model, created, text=text.flush(), finish=finish))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {
                "prompt_tokens": n_prompt,
                "total_tokens": n_prompt + produced,
                "completion_tokens": produced,
            }
            await resp.write(_chunk(kind, rid, model, created, usage=usage))
    except Exception as exc:  # vLLM's streaming error: an error event, then [DONE]
        message = json.dumps(error_body(str(exc), "InternalServerError", 500))
        await resp.write(f"data: {message}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def models(request: Any) -> Any:
    from aiohttp import web

    state: ServerState = request.app["state"]
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "trtspec",
                    "max_model_len": state.engine.config.max_seq_len,
                }
            ],
        }
    )


async def health(request: Any) -> Any:
    from aiohttp import web

    return web.Response(status=200)


def metrics_text(state: ServerState) -> str:
    labels = f'engine="0",model_name="{state.model_name}"'
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{{{lab}}} {value:.1f}" for lab, value in samples)

    family(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        [(labels, state.running)],
    )
    family(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        [(labels, state.prompt_tokens)],
    )
    family(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        [(labels, state.generation_tokens)],
    )
    family(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        [(labels, state.requests)],
    )
    if state.mode != "none":
        spec = state.spec
        family(
            "vllm:spec_decode_num_drafts_total",
            "counter",
            "Number of spec decoding drafts.",
            [(labels, spec.drafts)],
        )
        family(
            "vllm:spec_decode_num_draft_tokens_total",
            "counter",
            "Number of draft tokens.",
            [(labels, spec.draft_tokens)],
        )
        family(
            "vllm:spec_decode_num_accepted_tokens_total",
            "counter",
            "Number of accepted tokens.",
            [(labels, spec.accepted_tokens)],
        )
        family(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            "Accepted tokens per draft position.",
            [(f'{labels},position="{i}"', v) for i, v in enumerate(spec.per_position)],
        )
    return "\n".join(lines) + "\n"


async def metrics(request: Any) -> Any:
    from aiohttp import web

    return web.Response(
        text=metrics_text(request.app["state"]), content_type="text/plain", charset="utf-8"
    )


def make_app(state: ServerState) -> Any:
    from aiohttp import web

    app = web.Application()
    app["state"] = state
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_post("/v1/completions", completions)
    return app


def load_state(
    engine_dir: Path,
    *,
    mode: str,
    model_name: str,
    num_draft_tokens: int | None,
    max_matching_ngram_size: int,
    tokenizer_dir: Path | None = None,
    threads: int | None = None,
) -> ServerState:
    from trtspec.runtime.engine import ReferenceEngine

    engine = ReferenceEngine.load(engine_dir, threads=threads)
    if mode == "ngram" and engine.config.mode != "draft_tokens_external":
        raise SystemExit(
            f"{engine_dir}: --mode ngram needs a draft_tokens_external engine "
            f"(this one is {engine.config.mode})"
        )
    k = num_draft_tokens or engine.config.max_draft_len
    tok_dir = tokenizer_dir or engine.config.tokenizer_dir
    return ServerState(
        engine=engine,
        tokenizer=Tokenizer(tok_dir),
        tokenizer_dir=tok_dir,
        model_name=model_name,
        mode=mode,
        num_draft_tokens=k,
        max_matching_ngram_size=max_matching_ngram_size,
        spec=SpecCounters(per_position=[0] * k),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trtspec.serve.openai_reference", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--engine", type=Path, required=True, help="Reference engine folder.")
    parser.add_argument(
        "--tokenizer", type=Path, help="Tokenizer folder (default ENGINE/tokenizer)."
    )
    parser.add_argument("--mode", choices=MODES, default="none")
    parser.add_argument("--num-draft-tokens", type=int, help="Draft tokens per round (ngram).")
    parser.add_argument("--max-matching-ngram-size", type=int, default=3)
    parser.add_argument("--served-model-name", default="target")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch threads (default: all cores).")
    args = parser.parse_args(argv)
    state = load_state(
        args.engine,
        mode=args.mode,
        model_name=args.served_model_name,
        num_draft_tokens=args.num_draft_tokens,
        max_matching_ngram_size=args.max_matching_ngram_size,
        tokenizer_dir=args.tokenizer,
        threads=args.threads,
    )
    asyncio.run(_serve(state, args.host, args.port))


async def _serve(state: ServerState, host: str, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(make_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main(sys.argv[1:])
