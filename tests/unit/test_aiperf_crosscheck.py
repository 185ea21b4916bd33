"""benchmarks/aiperf_crosscheck.py's own logic, without AIPerf or a model: the
minimal client (``minimal_stream``) against a loopback socket that answers a
chunked SSE stream with known pauses and awkward splits, its errors, the
AIPerf argv's worker limits and the rotated order of the tools."""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import aiperf_crosscheck as cc
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def _event(obj: object) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _text(piece: str) -> bytes:
    return _event({"object": "text_completion", "choices": [{"index": 0, "text": piece}]})


USAGE = _event({"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 5}})
DONE = b"data: [DONE]\n\n"


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@contextmanager
def serve(
    writes: list[tuple[float, bytes]], *, status: str = "200 OK"
) -> Iterator[tuple[str, list[bytes]]]:
    """A one-connection HTTP/1.1 server on loopback: reads the request, sends
    the headers, then each ``(pause_s, body bytes)`` as its own chunk after
    sleeping ``pause_s``; ``b""`` closes the connection without the last chunk."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    received: list[bytes] = []

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(
                next(
                    line.split(b":")[1]
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
            )
            while len(body) < length:
                body += conn.recv(65536)
            received.append(body)
            conn.sendall(
                f"HTTP/1.1 {status}\r\nContent-Type: text/event-stream\r\n"
                "Transfer-Encoding: chunked\r\n\r\n".encode()
            )
            for pause, data in writes:
                time.sleep(pause)
                if not data:
                    return  # cut the connection mid-stream
                conn.sendall(_chunked(data))
            conn.sendall(b"0\r\n\r\n")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1/completions", received
    finally:
        thread.join(5)
        listener.close()


def test_minimal_client_times_the_first_and_last_text_events() -> None:
    second = _text(" world")
    writes = [
        (0.0, b": keep-alive comment\n\n"),  # no text: not the first token
        (0.15, _text("Hello")),
        # the next event split mid-line, with CRLF line ends, over two writes
        (0.2, second[:11].replace(b"\n", b"\r\n")),
        (0.0, second[11:].replace(b"\n", b"\r\n")),
        (0.1, USAGE + DONE),
    ]
    body = {"model": "m", "prompt": "p", "stream": True, "max_tokens": 3}
    with serve(writes) as (url, received):
        timing = cc.minimal_stream(url, body)
    assert json.loads(received[0]) == body
    assert timing.error is None
    assert timing.text == "Hello world"
    assert timing.completion_tokens == 3
    assert timing.events == 4  # two texts, usage, [DONE]; the comment is no event
    assert timing.ttft_ms is not None and timing.latency_ms is not None
    assert 140 <= timing.ttft_ms < 400
    assert 330 <= timing.latency_ms < 700  # the last text, not the usage or [DONE]
    assert timing.done_ns is not None and timing.last_text_ns is not None
    assert (timing.done_ns - timing.last_text_ns) / 1e6 >= 90
    assert timing.first_byte_ns is not None and timing.first_byte_ns <= timing.first_text_ns


@pytest.mark.parametrize(
    ("writes", "status", "error"),
    [
        ([(0.0, _text("a")), (0.0, b"")], "200 OK", "RemoteDisconnected|IncompleteRead"),
        ([(0.0, _text("a"))], "200 OK", "stream ended without data: \\[DONE\\] after 1 event"),
        ([(0.0, b"oops")], "500 Internal Server Error", "HTTP 500: oops"),
        ([(0.0, b"data: {not json\n\n")], "200 OK", "JSONDecodeError"),
        (
            [(0.0, _event({"error": {"message": "boom"}}))],
            "200 OK",
            "server error event: {'message': 'boom'}",
        ),
    ],
)
def test_minimal_client_reports_broken_streams(
    writes: list[tuple[float, bytes]], status: str, error: str
) -> None:
    import re

    with serve(writes, status=status) as (url, _):
        timing = cc.minimal_stream(url, {"prompt": "p"}, timeout_s=5)
    assert timing.error is not None and re.search(error, timing.error), timing.error


def test_aiperf_argv_limits_workers_and_record_processors(tmp_path: Path) -> None:
    common = {
        "data": tmp_path / "d.jsonl",
        "requests": 5,
        "warmup": 1,
        "tokenizer": tmp_path / "tok",
        "out": tmp_path / "out",
    }
    argv = cc.aiperf_argv(
        Path("aiperf"), "http://127.0.0.1:9", "m", workers=1, record_processors=2, **common
    )
    assert argv[argv.index("--workers-max") + 1] == "1"
    assert argv[argv.index("--record-processors") + 1] == "2"
    assert argv[argv.index("--concurrency") + 1] == "1"
    default = cc.aiperf_argv(
        Path("aiperf"), "http://127.0.0.1:9", "m", workers=None, record_processors=None, **common
    )
    assert "--workers-max" not in default and "--record-processors" not in default
    assert "--no-server-metrics" not in default
    quiet = cc.aiperf_argv(
        Path("aiperf"),
        "http://127.0.0.1:9",
        "m",
        workers=1,
        record_processors=1,
        server_metrics=False,
        **common,
    )
    assert quiet[-1] == "--no-server-metrics"


def test_rotated_order_puts_every_tool_in_every_position() -> None:
    order = cc.rotated_order(3)
    rounds = [order[i : i + 3] for i in range(0, 9, 3)]
    assert rounds == [
        ["trtspec", "aiperf", "minimal"],
        ["aiperf", "minimal", "trtspec"],
        ["minimal", "trtspec", "aiperf"],
    ]
    for position in range(3):
        assert {r[position] for r in rounds} == set(cc.TOOLS)


def test_process_cpu_seconds_of_a_live_process() -> None:
    start = cc.process_cpu_s(os.getpid())
    t0 = time.process_time()
    while time.process_time() - t0 < 0.3:
        pass
    assert cc.process_cpu_s(os.getpid()) - start >= 0.2
