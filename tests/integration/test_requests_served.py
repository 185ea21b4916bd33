"""Cancellation and bad request values through the real tritonserver.

A reference repository (baseline, an ngram draft loop, lookahead, the router;
the every-mode one test_repo_served.py asks other questions of, with the
routes ``copy`` → ngram and ``long`` → lookahead) served by nvidia-pytriton's
tritonserver, driven with tritonclient gRPC streaming:

- a client that cancels its stream (``stop_stream(cancel_requests=True)``)
  stops the router, the orchestrator and the engine at their next step: the
  server log says so with fewer tokens than asked for, the draft loop's engine
  runs no more verify calls, and the next short request is served about as
  fast as alone (compared with a whole long generation, never with absolute
  times, so CPU contention cannot decide it);
- bad sampling values are the client's error (``INVALID_ARG``, the words of
  ``trtspec.runtime.limits``) at the router, the orchestrator and the engine (a
  stream's error carries only its message, so the code shows at the engine,
  called without a stream, and in the router's refusal to fall back);
- the router retries server-side failures on the fallback variant, never a
  client's error.
"""

from __future__ import annotations

import queue
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox jumps over the lazy dog. The quick brown fox"
SHORT_PROMPT = "Hello! How are you today?"
LONG = 400  # tokens: seconds of generation on the tiny model
SHORT = 4
ENGINE_CANCEL = re.compile(r"reference engine: request cancelled after (\d+) of (\d+) tokens")


@dataclass
class Reply:
    texts: list[str] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # a stream's errors carry no status code, only the message
    seconds: float = 0.0


@pytest.fixture(scope="module")
def served(every_mode_served):
    """``(server, plan)`` of the every-mode repository
    (tests/fixtures/every_mode.py), served once for this module and
    test_repo_served.py; a test that unloads a model loads it again."""
    server, _spec, plan, _repo = every_mode_served.get()
    return server, plan


def _inputs(prompt: str | bytes, max_tokens: int, **extra: Any) -> list:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: Any, dtype: str) -> Any:
        kind = {
            "BYTES": np.object_,
            "INT32": np.int32,
            "FP32": np.float32,
            "BOOL": np.bool_,
            "UINT64": np.uint64,
        }[dtype]
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=kind))
        return t

    dtypes = {
        "route": "BYTES",
        "temperature": "FP32",
        "top_p": "FP32",
        "top_k": "INT32",
        "num_draft_tokens": "INT32",
        "seed": "UINT64",
    }
    tensors = [
        tensor("text_input", prompt if isinstance(prompt, bytes) else prompt.encode(), "BYTES"),
        tensor("max_tokens", max_tokens, "INT32"),
        tensor("stream", True, "BOOL"),
    ]
    extra.setdefault("temperature", 0.0)
    for name, value in extra.items():
        tensors.append(
            tensor(name, value.encode() if isinstance(value, str) else value, dtypes[name])
        )
    return tensors


def infer(server: Any, model: str, prompt: str | bytes, max_tokens: int, **extra: Any) -> Reply:
    """One streamed request to the end; its wall time in ``seconds``."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    reply = Reply()
    start = time.monotonic()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, _inputs(prompt, max_tokens, **extra))
        while True:
            result, error = results.get(timeout=300)
            if error is not None:
                reply.error = error.message()
                break
            reply.texts.append(result.as_numpy("text_output")[0].decode("utf-8"))
            if bool(result.as_numpy("is_final")[0]):
                for name in ("completion_tokens", "draft_tokens", "rounds"):
                    reply.final[name] = int(result.as_numpy(name)[0])
                reply.final["variant"] = result.as_numpy("variant")[0].decode()
                reply.final["fallback"] = bool(result.as_numpy("fallback")[0])
                break
    finally:
        reply.seconds = time.monotonic() - start
        client.stop_stream()
        client.close()
    return reply


def cancel_after(server: Any, model: str, prompt: str, responses: int, **extra: Any) -> None:
    """Start a LONG streamed request, read ``responses`` responses, then cancel
    the client stream the way a client that went away does."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, _inputs(prompt, LONG, **extra))
        for _ in range(responses):
            result, error = results.get(timeout=300)
            assert error is None, error
            assert not bool(result.as_numpy("is_final")[0])
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def _wait_for(server: Any, pattern: re.Pattern, after: int, timeout: float = 120) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = pattern.findall(server.log_text()[after:])
        if found:
            return found
        time.sleep(0.2)
    return []


def _successes(server: Any, model: str) -> int:
    pattern = rf'nv_inference_request_success{{model="{re.escape(model)}",version="1"}} (\d+)'
    match = re.search(pattern, server.metrics())
    return int(match.group(1)) if match else 0


@pytest.mark.parametrize(
    ("model", "variant", "route"),
    [
        ("baseline", "baseline", None),
        ("ngram", "ngram", None),
        ("router", "lookahead", "long"),
    ],
)
def test_a_cancelled_stream_stops_every_model_at_the_next_step(
    served, model: str, variant: str, route: str | None
) -> None:
    server, plan = served
    extra = {"route": route} if route else {}
    alone = infer(server, model, SHORT_PROMPT, SHORT, **extra)
    whole = infer(server, model, PROMPT, LONG, **extra)
    assert alone.error is None and whole.error is None, (alone.error, whole.error)
    # the premise: the long request really runs LONG tokens when left alone
    assert whole.final["completion_tokens"] == LONG
    assert whole.final["variant"] == variant

    mark = len(server.log_text())
    engine = plan.variants[variant].target
    verifies = _successes(server, engine)
    cancel_after(server, model, PROMPT, responses=3, **extra)
    after = infer(server, model, SHORT_PROMPT, SHORT, **extra)
    assert after.error is None, after.error
    # the same answer; not the same chunks: engine responses that queue up
    # under load go out as one response (threads.batches_within_deadline)
    assert "".join(after.texts) == "".join(alone.texts)
    # That the short request did not wait for the rest of the cancelled one is
    # shown by events below, not by a wall-clock ratio (which a loaded two-core
    # machine can break): the orchestrator logs the cancel after N < LONG
    # tokens, and the engine itself (or, for the draft loop, its verify calls)
    # stopped before LONG.
    print(
        f"\n{model}: short alone {alone.seconds:.2f}s, {LONG} tokens {whole.seconds:.2f}s, "
        f"short after a cancel {after.seconds:.2f}s"
    )  # figures for the closing note (-s)

    orchestrator = re.compile(rf"{variant}: request cancelled after (\d+) of {LONG} tokens")
    stopped = _wait_for(server, orchestrator, mark)
    assert stopped, server.log_tail(30)
    assert int(stopped[0]) < LONG
    if variant == "ngram":
        # the draft loop stopped calling its engine: no verify call runs later
        settled = _successes(server, engine)
        time.sleep(1.5)
        assert _successes(server, engine) == settled
        assert settled - verifies < LONG  # far fewer rounds than a whole generation
    else:
        engine_stop = _wait_for(server, ENGINE_CANCEL, mark)
        assert engine_stop, server.log_tail(30)
        done, asked = (int(v) for v in engine_stop[0])
        assert (asked, done < LONG) == (LONG, True)
    if route:
        assert _wait_for(server, re.compile(r"router: request cancelled"), mark)


TEMPERATURE = "temperature must be a finite number >= 0 (0 = greedy), got "
BAD_VALUES = [
    ({"temperature": float("nan")}, TEMPERATURE + "nan"),
    ({"temperature": -1.0}, TEMPERATURE + "-1.0"),
    ({"temperature": float("inf")}, TEMPERATURE + "inf"),
    ({"top_p": 1.5}, "top_p must be in (0, 1] (1 = off), got 1.5"),
    ({"top_p": 0.0}, "top_p must be in (0, 1] (1 = off), got 0.0"),
    ({"top_k": -1}, "top_k must be an integer in [0, 2147483647] (0 = off), got -1"),
]


@pytest.mark.parametrize(("extra", "message"), BAD_VALUES)
def test_bad_values_are_the_clients_error_at_router_and_orchestrator(
    served, extra: dict, message: str
) -> None:
    server, _ = served
    for model, prefix in (("router", "router"), ("baseline", "baseline"), ("ngram", "ngram")):
        reply = infer(server, model, PROMPT, SHORT, **extra)
        assert reply.error == f"{prefix}: invalid request: {message}", model


def test_max_tokens_zero_is_the_clients_error(served) -> None:
    reply = infer(served[0], "router", PROMPT, 0)
    assert reply.error == (
        "router: invalid request: max_tokens must be an integer in [1, 2147483647], got 0"
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "temperature",
            np.float32("nan"),
            "temperature must be a finite number >= 0 (0 = greedy), got nan",
        ),
        (
            "temperature",
            np.float32(-0.5),
            "temperature must be a finite number >= 0 (0 = greedy), got -0.5",
        ),
        ("runtime_top_p", np.float32(2.0), "runtime_top_p must be in (0, 1] (1 = off), got 2.0"),
        (
            "runtime_top_k",
            np.int32(-3),
            "runtime_top_k must be an integer in [0, 2147483647] (0 = off), got -3",
        ),
    ],
)
def test_bad_values_are_the_clients_error_at_the_engine(
    served, name: str, value: Any, message: str
) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server, plan = served
    engine = plan.variants["ngram"].target  # not decoupled: one infer call

    def tensor(tname: str, array: np.ndarray) -> Any:
        dtype = {
            np.dtype(np.int32): "INT32",
            np.dtype(np.float32): "FP32",
            np.dtype(np.bool_): "BOOL",
        }[array.dtype]
        t = grpcclient.InferInput(tname, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        return t

    inputs = [
        tensor("input_ids", np.array([[5, 17, 42, 99]], dtype=np.int32)),
        tensor("input_lengths", np.array([[4]], dtype=np.int32)),
        tensor("request_output_len", np.array([[2]], dtype=np.int32)),
        tensor(name, np.array([[value]])),
    ]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as err:
            client.infer(engine, inputs)
    finally:
        client.close()
    # marked, since on 2.51 a BLS caller sees the message but not the code
    assert (err.value.message(), err.value.status()) == (
        f"invalid request: {message}",
        "StatusCode.INVALID_ARGUMENT",
    )


def test_router_returns_a_clients_error_without_the_fallback(served) -> None:
    server, _ = served
    baseline_runs = _successes(server, "baseline")
    reply = infer(server, "router", PROMPT, SHORT, route="copy", num_draft_tokens=9)
    assert reply.error == (
        "router: ngram: invalid request: num_draft_tokens must be in "
        "[0, 4] (the variant's max_draft_len), got 9"
    )
    assert _successes(server, "baseline") == baseline_runs  # never run twice


@pytest.mark.parametrize(
    ("route", "prompt", "message"),
    [
        # 600 words: over the every-mode spec's max_input_len (128 tokens); the
        # draft loop refuses it up front in the engine's words (it knows the
        # baseline's limit), lookahead's engine refuses it itself
        (
            "copy",
            "word " * 600,
            r"router: ngram: invalid request: Prompt length \(\d+\) exceeds "
            r"maximum input length \(128\)\.",
        ),
        (
            "long",
            "word " * 600,
            r"router: lookahead: invalid request: target_lookahead_lookahead: Prompt length "
            r"\(\d+\) exceeds maximum input length \(128\)\.",
        ),
        (
            "copy",
            b"caf\xe9 au lait",
            r"router: ngram: invalid request: text_input must be UTF-8 text, got byte 0xE9 at "
            r"position 3",
        ),
    ],
)
def test_a_request_no_variant_can_serve_is_not_retried_on_the_fallback(
    served, route: str, prompt: str | bytes, message: str
) -> None:
    """Issue 28: a prompt over max_input_len, or text that is not UTF-8, is the
    client's error: answered as such, never run again on the fallback, and
    no raw Python message (a codec error) reaches the client."""
    server, _ = served
    baseline_runs = _successes(server, "baseline")
    reply = infer(server, "router", prompt, SHORT, route=route)  # type: ignore[arg-type]
    assert reply.error is not None and re.fullmatch(message, reply.error), reply.error
    assert "codec" not in reply.error and "Traceback" not in reply.error
    assert _successes(server, "baseline") == baseline_runs  # never run twice


def test_an_empty_prompt_is_served_or_refused_alike_on_every_variant(served) -> None:
    """An empty prompt is no server-side failure: each variant answers it the
    way the baseline does (the tokenizer's BOS makes it a legal prompt), and
    the router never retries it on the fallback."""
    server, _ = served
    baseline = infer(server, "baseline", "", SHORT)
    for route in ("copy", "long"):
        runs = _successes(server, "baseline")
        reply = infer(server, "router", "", SHORT, route=route)
        assert (reply.error is None) == (baseline.error is None), (route, reply.error)
        if reply.error is None:
            assert reply.final["fallback"] is False and "".join(reply.texts) == "".join(
                baseline.texts
            )
        assert _successes(server, "baseline") == runs


def test_a_negative_num_draft_tokens_is_refused_by_every_variant(served) -> None:
    """Issue 28: lookahead and baseline ignored num_draft_tokens, so -1 passed."""
    server, _ = served
    for model in ("baseline", "lookahead", "ngram"):
        reply = infer(server, model, PROMPT, SHORT, num_draft_tokens=-1)
        assert reply.error == (
            f"{model}: invalid request: num_draft_tokens must be an integer in "
            "[0, 2147483647], got -1"
        ), model


def test_router_still_falls_back_on_a_server_side_failure(served) -> None:
    server, plan = served
    engine = plan.variants["ngram"].target
    server.unload_model(engine)
    try:
        direct = infer(server, "ngram", PROMPT, SHORT)
        assert direct.error is not None and engine in direct.error
        reply = infer(server, "router", PROMPT, SHORT, route="copy")
        assert reply.error is None, reply.error
        assert (reply.final["variant"], reply.final["fallback"]) == ("baseline", True)
    finally:
        server.load_model(engine)


# prompt + max_tokens past max_seq_len (512) of the every-mode spec
OVERRUN = 510


def test_a_failure_mid_stream_reaches_the_client_and_frees_the_slot(served) -> None:
    """``ngram_unbounded`` has no length parameters (a repository assembled
    before them, tests/fixtures/every_mode.py), so it streams until the engine
    refuses a round past max_seq_len: a real failure mid-stream. It reaches
    the client through the router as the engine's error, long before the
    request's deadline (30 s + 2 s a token, 1,050 s here), and the route's
    one slot (max_concurrency 1) is free for the next request."""
    from trtspec.runtime.threads import stream_timeout_us

    server, _ = served
    refusal = "exceeds maximum sequence length (512)."
    # The baseline refuses it up front, and so does a loop that knows its lengths.
    for model in ("baseline", "ngram"):
        reply = infer(server, model, PROMPT, OVERRUN)
        assert reply.error is not None and refusal in reply.error, (model, reply.error)
        assert reply.texts == [], model
    reply = infer(server, "router", PROMPT, OVERRUN, route="overrun")
    assert reply.texts, "it failed before streaming: not a mid-stream failure"
    assert reply.error is not None, reply.final
    # the engine's words, marked as the request's own limit (the baseline
    # refuses the same prompt + max_tokens up front); after streaming nothing
    # is retried either way
    assert reply.error.startswith("router: ngram_unbounded: invalid request: target_dte: "), (
        reply.error
    )
    assert "exceeds maximum" in reply.error, reply.error
    assert reply.seconds < stream_timeout_us(OVERRUN) / 1e6 / 10, reply.seconds
    # the slot was released: the route's next request is the variant's, not the fallback's
    after = infer(server, "router", PROMPT, SHORT, route="overrun")
    assert after.error is None, after.error
    assert (after.final["variant"], after.final["fallback"]) == ("ngram_unbounded", False)
    print(f"mid-stream failure reached the client after {reply.seconds:.1f} s")


def test_a_variant_whose_stub_died_under_load_is_served_by_its_fallback(
    served, last_user_of
) -> None:
    """Issues 28 and 44: with 4 requests in flight on route ``copy`` (→
    ngram, generated in the router's process on the ``target_dte`` engine),
    that engine's stub is killed. The watchdog (with trtspec serve's
    fallback map) restarts nothing and marks every variant on it down; the
    requests in flight on it end within a few seconds of that (on the
    fallback where nothing was streamed yet, else with an error), not at
    their deadline (62-70 s before); every request sent afterwards is
    served by the fallback (baseline, ``fallback: true``). Then, unless
    this is the shared server's last test, it is restarted so later tests
    find the variants again."""
    import os
    import signal
    import threading

    from trtspec.serve import StubWatchdog, fallback_covered, stubs_of

    server, _ = served
    covered = fallback_covered(server.repo)
    assert covered["ngram"] == ("ngram",)
    assert "ngram" in covered["target_dte"] and "baseline" not in covered["target_dte"]
    watchdog = StubWatchdog(server, interval_s=0.2, fallback=covered).prime().start()
    rows: list[tuple[float, float, Reply]] = []  # (sent, ended, reply)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            reply = infer_within(server, "router", PROMPT, 32, 20.0, route="copy")
            rows.append((sent, time.monotonic(), reply))

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        time.sleep(1.0)  # the loop is under way: every client has a request in flight
        victim = next(p for p, s in stubs_of(server.pid).items() if s.instance == "target_dte_0_0")
        # Stopped first, for half a second: every request in flight comes
        # to its next engine call and is held in the stub, the way a killed
        # stub's own requests are (killed at once, the requests between two
        # calls got Triton's "not healthy" at their next one and only some
        # runs had one waiting inside)
        os.kill(victim, signal.SIGSTOP)
        time.sleep(0.5)
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not watchdog.down and time.monotonic() < deadline:
            time.sleep(0.05)
        marked = time.monotonic()
        assert set(watchdog.down) == set(covered["target_dte"]), watchdog.incidents
        stop.set()
        for t in threads:
            t.join(timeout=30)
        # the requests in flight when it died ended within seconds of the mark
        caught = [(sent, ended, r) for sent, ended, r in rows if sent < killed < ended]
        assert caught, rows
        late = [(round(ended - marked, 1), r.error) for _, ended, r in caught if ended > marked + 5]
        assert not late, late
        for _, _, r in caught:  # an error, or the fallback, or done before it mattered
            assert r.error or r.final["variant"] in ("ngram", "baseline"), r
        print(
            f"in flight at the kill: {len(caught)}; ended "
            f"{max(ended for _, ended, _ in caught) - marked:.1f} s after the mark at most"
        )
        after: list[Reply] = []

        def fresh() -> None:
            for _ in range(2):
                after.append(infer_within(server, "router", PROMPT, 16, 120.0, route="copy"))

        senders = [threading.Thread(target=fresh, daemon=True) for _ in range(4)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(timeout=300)
        assert server.restarts == 0  # nothing restarted while the variant was down
        assert len(after) == 8
        assert [r.error for r in after if r.error] == []
        assert {(r.final["variant"], r.final["fallback"]) for r in after} == {("baseline", True)}
    finally:
        stop.set()
        watchdog.stop()
        restore = not last_user_of("every_mode_served")
        if restore:
            server.restart(timeout=300)  # the variants back for the tests after this one
    if restore:
        again = infer(server, "router", PROMPT, SHORT, route="copy")
        assert (again.final["variant"], again.final["fallback"]) == ("ngram", False), again


def infer_within(
    server: Any, model: str, prompt: str, max_tokens: int, timeout: float, **extra: Any
) -> Reply:
    """``infer`` that gives up after ``timeout`` seconds and cancels its stream
    (a request stuck inside a dead stub must not hold the test)."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    reply = Reply()
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(model, _inputs(prompt, max_tokens, **extra))
        deadline = time.monotonic() + timeout
        while True:
            try:
                result, error = results.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                reply.error = f"no answer within {timeout:g} s"
                break
            if error is not None:
                reply.error = error.message()
                break
            if bool(result.as_numpy("is_final")[0]):
                reply.final["variant"] = result.as_numpy("variant")[0].decode()
                reply.final["fallback"] = bool(result.as_numpy("fallback")[0])
                break
    finally:
        client.stop_stream(cancel_requests=reply.error is not None)
        client.close()
    return reply
