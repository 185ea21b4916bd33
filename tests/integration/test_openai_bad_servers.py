"""Bad OpenAI-compatible servers on real sockets (127.0.0.1): each failure
becomes one clear per-request error and the run never hangs — connection
refused, HTTP 500, malformed SSE, a stream cut before ``[DONE]``, a server that
stalls before or after its headers, a wrong content type and a connection
dropped without a response. The loads go through ``run_jobs`` with the
benchmark's own ``ArmWorker``, as a run sends them."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aiohttp import web

from trtspec.bench.client import Arm, Job, Outcome, run_jobs
from trtspec.bench.external import ArmWorker
from trtspec.bench.openai_client import OpenAIEndpoint

CHUNK = b'data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}\n\n'


class _Server:
    """An aiohttp app on its own loop thread; stops at teardown."""

    def __init__(self, handler: Callable[[web.Request], Any]) -> None:
        self.stopping = asyncio.Event()
        self._ready = threading.Event()
        self.url = ""
        self._thread = threading.Thread(target=self._run, args=(handler,), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self, handler: Callable[[web.Request], Any]) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main(handler))
        finally:
            self.loop.close()

    async def _main(self, handler: Callable[[web.Request], Any]) -> None:
        self.stopping = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        self._ready.set()
        await self.stopping.wait()
        await runner.cleanup()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stopping.set)
        self._thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[web.Request], Any]], str]]:
    servers: list[_Server] = []

    def start(handler: Callable[[web.Request], Any]) -> str:
        servers.append(_Server(handler))
        return servers[-1].url

    yield start
    for s in servers:
        s.stop()


def _run(url: str, timeout_s: float = 1.5, n: int = 2, workers: int = 1) -> list[Outcome]:
    arm = Arm("ext", "m", openai=OpenAIEndpoint(url, "m"))
    jobs = [
        Job(
            "r",
            0,
            i,
            {"prompt": "p"},
            "p",
            8,
            arm,
            0.0,
            1.0,
            0,
            i,
            "concurrency=1",
            workers,
            None,
            False,
            f"id{i}",
        )
        for i in range(n)
    ]
    done: list[Outcome] = []
    run_jobs(
        "",
        jobs,
        workers=workers,
        on_done=done.append,
        stop=threading.Event(),
        request_timeout_s=timeout_s,
        make_worker=lambda: ArmWorker("", timeout_s, lambda job: None),
    )
    return done


async def _sse(request: web.Request, body: bytes, *, finish: bool = True) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(body)
    if finish:
        await resp.write_eof()
    return resp


def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcomes = _run(f"http://127.0.0.1:{port}")
    assert len(outcomes) == 2
    for o in outcomes:
        assert o.error is not None
        assert o.error.startswith(f"connection failed: http://127.0.0.1:{port}: "), o.error


def test_http_500_with_vllm_error_body(serve: Callable[..., str]) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "error": {
                    "message": "CUDA out of memory",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            },
            status=500,
        )

    outcomes = _run(serve(handler))
    assert [o.error for o in outcomes] == ["HTTP 500: CUDA out of memory"] * 2


def test_http_500_plain_text(serve: Callable[..., str]) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=500, text="Internal Server Error")

    assert _run(serve(handler), n=1)[0].error == "HTTP 500: Internal Server Error"


def test_malformed_sse(serve: Callable[..., str]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _sse(request, CHUNK + b"data: {oops\n\n")

    o = _run(serve(handler), n=1)[0]
    assert o.error == "malformed SSE: event data is not JSON: '{oops'"
    assert o.text == "hi"


def test_stream_without_done(serve: Callable[..., str]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _sse(request, CHUNK + CHUNK)

    outcomes = _run(serve(handler))
    assert [o.error for o in outcomes] == [
        "stream ended without data: [DONE] after 2 chunk(s): the server closed the response early"
    ] * 2


@pytest.mark.parametrize("before_headers", [True, False])
def test_stalled_server_times_out(serve: Callable[..., str], before_headers: bool) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if before_headers:
            await asyncio.sleep(3600)
        resp = await _sse(request, CHUNK, finish=False)
        await asyncio.sleep(3600)
        return resp

    t0 = time.monotonic()
    outcomes = _run(serve(handler), timeout_s=1.0)
    elapsed = time.monotonic() - t0
    received = 0 if before_headers else 1
    assert [o.error for o in outcomes] == [
        f"timeout: stream unfinished after 1s ({received} chunk(s) received)"
    ] * 2
    assert elapsed < 20, elapsed  # two 1 s timeouts, generous under CPU contention


def test_wrong_content_type(serve: Callable[..., str]) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"choices": []})

    assert _run(serve(handler), n=1)[0].error == (
        "expected an SSE stream (Content-Type text/event-stream), got "
        "application/json; charset=utf-8"
    )


def test_connection_dropped_without_response() -> None:
    """A raw socket server that reads the request and closes the connection."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]

    def accept() -> None:
        listener.settimeout(10)
        for _ in range(2):
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        outcomes = _run(f"http://127.0.0.1:{port}")
    finally:
        listener.close()
        thread.join(10)
    for o in outcomes:
        assert o.error == (
            "connection closed mid-response after 0 chunk(s) without data: "
            "[DONE] (ServerDisconnectedError)"
        ), o.error


def test_good_stream_after_bad_one_on_the_same_worker(serve: Callable[..., str]) -> None:
    """A worker recovers its connection: an error does not poison the next request."""
    calls: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        if len(calls) == 1:
            return await _sse(request, b"data: {oops\n\n")
        usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        return await _sse(request, CHUNK + f"data: {usage}\n\ndata: [DONE]\n\n".encode())

    first, second = _run(serve(handler))
    assert first.error is not None and first.error.startswith("malformed SSE")
    assert second.error is None and second.text == "hi"
    assert second.final["completion_tokens"] == 1
