"""Streaming client for OpenAI-compatible servers (vLLM, trtllm-serve, SGLang,
Triton's OpenAI frontend): the benchmark's *external arms*.

It owns three things. ``SseParser`` is an incremental parser of the
``text/event-stream`` format as the WHATWG HTML standard defines it (lines end
in LF, CRLF or CR; ``:`` starts a comment, which servers send as keep-alives;
``data:`` lines accumulate until a blank line dispatches the event; a partial
event at end of stream is dropped). ``StreamState`` reads the OpenAI chunk
objects in those events: text deltas (``choices[0].delta.content`` for chat,
``choices[0].text`` for completions), the usage-only final chunk that
``stream_options: {include_usage: true}`` asks for (``choices: []``), error
events (``data: {"error": {...}}``, vLLM's form, or an ``event: error`` field)
and the ``data: [DONE]`` sentinel. ``OpenAIWorker`` sends one job at a time
over one keep-alive connection, from its own asyncio loop on the calling
worker thread (aiohttp), so a stalled server, a stop request or the per-request
deadline interrupt a read without corrupting anything; it fills the same
``Outcome`` the Triton worker fills, so rows, summary and report need no
second code path. Routes whose items carry ``messages`` go to
``/v1/chat/completions`` (the server renders its own chat template); items
with a plain ``prompt`` go to ``/v1/completions`` with exactly the text the
Triton arms receive.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trtspec.bench.client import FinalFields, Job, Outcome
from trtspec.bench.openai_metrics import Scrape

_POLL_S = 0.2
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
MODELS_PATH = "/v1/models"
DONE = "[DONE]"


@dataclass(frozen=True)
class OpenAIEndpoint:
    """Where an external arm sends its requests."""

    url: str  # base URL without /v1, e.g. http://127.0.0.1:8000
    model: str  # the served model name sent as "model"
    metrics_url: str | None = None  # Prometheus text endpoint; None = not scraped
    api_key_env: str | None = None  # environment variable holding a bearer token


def base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all name one server."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


# -- SSE ------------------------------------------------------------------------------------


@dataclass
class SseEvent:
    data: str
    event: str = "message"


class SseParser:
    """Incremental ``text/event-stream`` parser: ``feed(bytes)`` returns the
    events completed by those bytes; bytes of an unfinished line wait."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""
        self.comments = 0  # keep-alive lines seen

    def feed(self, chunk: bytes) -> list[SseEvent]:
        self._buffer += chunk
        events: list[SseEvent] = []
        while True:
            cut = -1
            for i, byte in enumerate(self._buffer):
                if byte in (0x0A, 0x0D):
                    cut = i
                    break
            if cut < 0:
                return events
            # A CR at the very end may be the first half of a CRLF: wait.
            if self._buffer[cut] == 0x0D and cut == len(self._buffer) - 1:
                return events
            line = self._buffer[:cut].decode("utf-8", errors="replace")
            skip = 2 if self._buffer[cut : cut + 2] == b"\r\n" else 1
            self._buffer = self._buffer[cut + skip :]
            event = self._line(line)
            if event is not None:
                events.append(event)

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            if not self._data:
                self._event = ""
                return None
            event = SseEvent("\n".join(self._data), self._event or "message")
            self._data, self._event = [], ""
            return event
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None  # id, retry and unknown fields do not matter here


# -- OpenAI chunks ---------------------------------------------------------------------------


def _error_text(obj: Any) -> str:
    """The message of an OpenAI-style error object (vLLM: ``{"error": {"message"}}``;
    older vLLM and others: ``{"object": "error", "message"}``; FastAPI: ``detail``)."""
    if isinstance(obj, dict):
        inner = obj.get("error", obj)
        if isinstance(inner, dict):
            for key in ("message", "detail"):
                if inner.get(key):
                    return str(inner[key])
        elif isinstance(inner, str) and inner:
            return inner
        if obj.get("detail"):
            return str(obj["detail"])
    return json.dumps(obj)[:200]


@dataclass
class StreamState:
    """What one streamed response has said so far."""

    api: str  # "chat" | "completions"
    text: str = ""
    first_text_ns: int | None = None
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    chunks: int = 0
    extra: FinalFields = field(default_factory=FinalFields)

    def apply(self, event: SseEvent, arrived_ns: int) -> None:
        if self.done or self.error:
            return
        data = event.data.strip()
        if data == DONE:
            self.done = True
            return
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            self.error = f"malformed SSE: event data is not JSON: {data[:80]!r}"
            return
        if (
            event.event == "error"
            or (isinstance(obj, dict) and "error" in obj)
            or (isinstance(obj, dict) and obj.get("object") == "error")
        ):
            self.error = f"server error event: {_error_text(obj)}"
            return
        if not isinstance(obj, dict):
            self.error = f"malformed SSE: expected a JSON object, got {data[:80]!r}"
            return
        self.chunks += 1
        if obj.get("usage"):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if choices is None:
            if not obj.get("usage"):
                self.error = "malformed SSE: a chunk has neither choices nor usage"
            return
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            if self.api == "chat":
                delta = (choice.get("delta") or {}).get("content")
            else:
                delta = choice.get("text")
            if delta:
                self.text += delta
                if self.first_text_ns is None:
                    self.first_text_ns = arrived_ns
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
            # trtllm-serve reports its per-request mean tokens per iteration
            if choice.get("avg_decoded_tokens_per_iter") is not None:
                self.extra["avg_decoded_tokens_per_iter"] = choice["avg_decoded_tokens_per_iter"]


def request_body(job: Job, endpoint: OpenAIEndpoint) -> tuple[str, str, dict[str, Any]]:
    """(path, api, JSON body) for one job: same sampling and seed as the Triton arms."""
    body: dict[str, Any] = {
        "model": endpoint.model,
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": job.max_tokens,
        "temperature": job.temperature,
        "top_p": job.top_p,
        "seed": job.seed,
    }
    if job.top_k:
        body["top_k"] = job.top_k  # vLLM, SGLang and trtllm-serve extension; 0 = off
    if job.item.get("messages"):
        body["messages"] = job.item["messages"]
        return CHAT_PATH, "chat", body
    body["prompt"] = job.text_input
    return COMPLETIONS_PATH, "completions", body


def headers_for(endpoint: OpenAIEndpoint) -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if endpoint.api_key_env and os.environ.get(endpoint.api_key_env):
        headers["Authorization"] = f"Bearer {os.environ[endpoint.api_key_env]}"
    return headers


def _http_error(status: int, body: bytes) -> str:
    text = body.decode("utf-8", errors="replace").strip()
    try:
        detail = _error_text(json.loads(text))
    except json.JSONDecodeError:
        detail = text[:200] or "(empty body)"
    return f"HTTP {status}: {detail}"


# -- the worker ------------------------------------------------------------------------------


class OpenAIWorker:
    """One keep-alive connection to one server, one request in flight, driven
    from the calling thread through a private event loop."""

    def __init__(
        self,
        endpoint: OpenAIEndpoint,
        request_timeout_s: float,
        scrape: Callable[[Job], Scrape | None] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.request_timeout_s = request_timeout_s
        # scrape(job) -> None, or a callable run after the request that
        # returns acceptance fields for the row (per-request metric deltas)
        self.scrape = scrape
        self._loop = asyncio.new_event_loop()
        self._session: Any = None

    async def _open(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=1, force_close=False), auto_decompress=False
            )
        return self._session

    def reconnect(self) -> None:
        self._loop.run_until_complete(self._close_session())

    async def _close_session(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
        self._session = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._close_session())
        with contextlib.suppress(Exception):
            self._loop.close()

    def run(self, job: Job, stop: threading.Event | None = None) -> Outcome:
        out = Outcome(job)
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        path, api, body = request_body(job, self.endpoint)
        payload = json.dumps(body).encode("utf-8")
        after = self.scrape(job) if self.scrape is not None else None
        out.send_time_unix = time.time()
        out.send_ns = time.perf_counter_ns()
        if job.scheduled_ns is not None:
            out.send_lag_ns = max(0, out.send_ns - job.scheduled_ns)
        out.overhead_wall_ns = out.send_ns - t0
        out.overhead_ns = time.thread_time_ns() - c0
        state = StreamState(api)
        try:
            self._loop.run_until_complete(
                self._stream(out, state, self.endpoint.url + path, payload, stop)
            )
        except Exception as exc:  # a client-side failure is a failed request
            out.error = out.error or f"request failed: {type(exc).__name__}: {exc}"
            self.reconnect()
        if out.end_ns is None:
            out.end_ns = time.perf_counter_ns()
        out.text = state.text
        out.first_text_ns = state.first_text_ns
        out.responses = state.chunks
        if out.error is None:
            out.error = self._verdict(state)
        if out.error is None and state.usage:
            out.final["prompt_tokens"] = state.usage.get("prompt_tokens")
            out.final["completion_tokens"] = state.usage.get("completion_tokens")
        out.final["finish_reason"] = state.finish_reason
        out.final.update(state.extra)
        if after is not None and out.error != "interrupted":
            out.final.update(after())
        return out

    @staticmethod
    def _verdict(state: StreamState) -> str | None:
        if state.error:
            return state.error
        if not state.done:
            return (
                f"stream ended without data: [DONE] after {state.chunks} chunk(s): the "
                "server closed the response early"
            )
        if not state.usage or state.usage.get("completion_tokens") is None:
            return (
                "stream carried no usage chunk: the server ignored stream_options."
                "include_usage, so token counts are unknown"
            )
        return None

    async def _stream(
        self,
        out: Outcome,
        state: StreamState,
        url: str,
        payload: bytes,
        stop: threading.Event | None,
    ) -> None:
        import aiohttp

        deadline = out.send_ns + int(self.request_timeout_s * 1e9)

        def remaining() -> float:
            return (deadline - time.perf_counter_ns()) / 1e9

        def expired() -> bool:
            if stop is not None and stop.is_set():
                out.error = "interrupted"
                return True
            if remaining() <= 0:
                out.error = (
                    f"timeout: stream unfinished after {self.request_timeout_s:g}s "
                    f"({state.chunks} chunk(s) received)"
                )
                return True
            return False

        session = await self._open()
        try:
            pending = asyncio.ensure_future(
                session.post(
                    url,
                    data=payload,
                    headers=headers_for(self.endpoint),
                    timeout=aiohttp.ClientTimeout(total=None),
                )
            )
            while not pending.done():
                await asyncio.wait([pending], timeout=min(_POLL_S, max(remaining(), 0.001)))
                if not pending.done() and expired():
                    pending.cancel()
                    with contextlib.suppress(BaseException):
                        await pending
                    await self._close_session()
                    return
            resp = pending.result()
            try:
                await self._read(resp, out, state, expired, remaining)
            finally:
                resp.release()
        except aiohttp.ClientConnectorError as exc:
            reason = exc.os_error.strerror if exc.os_error and exc.os_error.strerror else exc
            out.error = f"connection failed: {self.endpoint.url}: {reason}"
            await self._close_session()
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            out.error = (
                f"connection closed mid-response after {state.chunks} chunk(s) "
                f"without data: [DONE] ({type(exc).__name__})"
            )
            await self._close_session()
        except aiohttp.ClientError as exc:
            out.error = f"HTTP client error: {type(exc).__name__}: {exc}"
            await self._close_session()
        if out.error is not None and out.error != "interrupted" and out.end_ns is None:
            out.end_ns = time.perf_counter_ns()

    async def _read(
        self,
        resp: Any,
        out: Outcome,
        state: StreamState,
        expired: Callable[[], bool],
        remaining: Callable[[], float],
    ) -> None:
        if resp.status != 200:
            body = b""
            with contextlib.suppress(Exception):
                body = await asyncio.wait_for(resp.content.read(4096), max(remaining(), 0.1))
            out.error = _http_error(resp.status, body)
            out.end_ns = time.perf_counter_ns()
            return
        ctype = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in ctype:
            out.error = (
                f"expected an SSE stream (Content-Type text/event-stream), got "
                f"{ctype or 'no Content-Type'}"
            )
            out.end_ns = time.perf_counter_ns()
            return
        parser = SseParser()
        while True:
            if expired():
                await self._close_session()
                return
            try:
                chunk = await asyncio.wait_for(
                    resp.content.readany(), timeout=min(_POLL_S, max(remaining(), 0.001))
                )
            except asyncio.TimeoutError:
                continue
            arrived = time.perf_counter_ns()
            if not chunk:
                out.end_ns = arrived
                return  # end of body: the verdict decides whether it ended well
            p0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            for event in parser.feed(chunk):
                state.apply(event, arrived)
            out.overhead_wall_ns += time.perf_counter_ns() - p0
            out.overhead_ns += time.thread_time_ns() - c0
            if state.done or state.error:
                out.end_ns = arrived
                if state.error:
                    await self._close_session()
                return


def list_models(url: str, *, timeout_s: float = 10.0, api_key_env: str | None = None) -> list[str]:
    """The model ids ``GET /v1/models`` lists; raises ``OSError`` or
    ``ValueError`` when the server cannot be reached or answers oddly."""
    import urllib.request

    request = urllib.request.Request(base_url(url) + MODELS_PATH)
    if api_key_env and os.environ.get(api_key_env):
        request.add_header("Authorization", f"Bearer {os.environ[api_key_env]}")
    with urllib.request.urlopen(request, timeout=timeout_s) as resp:
        obj = json.loads(resp.read().decode("utf-8"))
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        raise ValueError(f"{MODELS_PATH} did not return {{'data': [...]}}")
    return [str(m.get("id")) for m in data if isinstance(m, dict)]
