"""A reference-backend repository for a spec with every mode, served by the
real tritonserver (nvidia-pytriton's bundled binary) and driven through
tritonclient gRPC streaming: every variant returns the baseline's text at
temperature 0, streams its first delta before the final response, and reports
exact draft/accepted counts; the router sends a deterministic share of a route
to its canary and falls back to the baseline when the draft engine is gone.

One server for every assertion, shared with test_requests_served.py (the
spec and routes are in tests/fixtures/every_mode.py): starting its 16
Python-backend stubs costs most of this test's time on a 2-core machine."""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fi",
    "Hello! Ünïcödé — 你好 — ✓ Hello! Ünïcödé",
]
MAX_TOKENS = 24


@dataclass
class Reply:
    texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    final: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)


@pytest.fixture(scope="module")
def served(every_mode_served):
    """``(server, spec, plan, repo)``: the every-mode repository
    (tests/fixtures/every_mode.py), served once for this module and
    test_requests_served.py."""
    return every_mode_served.get()


def infer(
    server,
    model: str,
    prompt: str,
    *,
    stream: bool = True,
    route: str | None = None,
    request_id: str | None = None,
    num_draft_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int | None = None,
    max_tokens: int = MAX_TOKENS,
    parameters: dict[str, str] | None = None,
) -> Reply:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value, dtype: str):
        array = np.array([value], dtype=np.object_ if dtype == "BYTES" else None)
        if dtype != "BYTES":
            array = array.astype(
                {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64}[
                    dtype
                ]
            )
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(array)
        return t

    inputs = [
        tensor("text_input", prompt.encode("utf-8"), "BYTES"),
        tensor("max_tokens", max_tokens, "INT32"),
        tensor("temperature", temperature, "FP32"),
        tensor("stream", stream, "BOOL"),
    ]
    if route is not None:
        inputs.append(tensor("route", route.encode(), "BYTES"))
    if request_id is not None:
        inputs.append(tensor("request_id", request_id.encode(), "BYTES"))
    if num_draft_tokens is not None:
        inputs.append(tensor("num_draft_tokens", num_draft_tokens, "INT32"))
    if seed is not None:
        inputs.append(tensor("seed", seed, "UINT64"))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    reply = Reply()
    try:
        client.start_stream(
            callback=lambda result, error: results.put((result, error, time.monotonic()))
        )
        client.async_stream_infer(model, inputs, request_id=request_id or "", parameters=parameters)
        deadline = time.monotonic() + 120
        while True:
            result, error, at = results.get(timeout=max(1.0, deadline - time.monotonic()))
            if error is not None:
                reply.error = str(error)
                break
            reply.times.append(at)
            reply.texts.append(result.as_numpy("text_output")[0].decode("utf-8"))
            reply.ids.extend(int(t) for t in result.as_numpy("output_ids"))
            if bool(result.as_numpy("is_final")[0]):
                for name in (
                    "prompt_tokens",
                    "completion_tokens",
                    "draft_tokens",
                    "accepted_tokens",
                    "rounds",
                    "server_ttft_ns",
                    "server_total_ns",
                    "prefix_reused_tokens",
                ):
                    reply.final[name] = int(result.as_numpy(name)[0])
                reply.final["variant"] = result.as_numpy("variant")[0].decode()
                reply.final["fallback"] = bool(result.as_numpy("fallback")[0])
                reply.final["position_acceptance"] = result.as_numpy("position_acceptance")
                break
    finally:
        client.stop_stream()
        client.close()
    return reply


@pytest.fixture(scope="module")
def baseline(served) -> list[Reply]:
    server = served[0]
    replies = [infer(server, "baseline", p) for p in PROMPTS]
    for reply in replies:
        assert reply.error is None, reply.error
    return replies


def test_baseline_streams_deltas_with_stats(served, baseline) -> None:
    from trtspec.runtime.text import Tokenizer

    tokenizer = Tokenizer(_tokenizer_dir(served[3]))
    for prompt, reply in zip(PROMPTS, baseline, strict=True):
        assert reply.final["variant"] == "baseline"
        assert reply.final["fallback"] is False
        assert reply.final["completion_tokens"] == len(reply.ids) > 0
        assert reply.final["draft_tokens"] == reply.final["accepted_tokens"] == 0
        assert reply.final["rounds"] == reply.final["completion_tokens"]
        assert 0 < reply.final["server_ttft_ns"] <= reply.final["server_total_ns"]
        # whole KV blocks (32 tokens) reused from the prefix cache at the first call
        reused = reply.final["prefix_reused_tokens"]
        assert reused % 32 == 0 and 0 <= reused < reply.final["prompt_tokens"], reused
        # TTFT: the first delta arrives before the final response
        assert len(reply.times) >= 2 and reply.times[0] < reply.times[-1]
        # the deltas add up to the decode of all ids, multi-byte characters included
        assert reply.text == tokenizer.decode(reply.ids), prompt


def test_non_streaming_returns_the_whole_text_once(served, baseline) -> None:
    reply = infer(served[0], "ngram", PROMPTS[0], stream=False)
    assert reply.error is None, reply.error
    assert len(reply.texts) == 1
    assert reply.text == baseline[0].text
    assert reply.ids == baseline[0].ids


@pytest.mark.parametrize(
    "variant", ["draft", "draft_logits", "ngram", "medusa", "eagle", "lookahead"]
)
def test_variant_equals_baseline_at_temperature_zero(served, baseline, variant: str) -> None:
    for prompt, expected in zip(PROMPTS, baseline, strict=True):
        reply = infer(served[0], variant, prompt)
        assert reply.error is None, reply.error
        assert reply.ids == expected.ids, (variant, prompt)
        assert reply.text == expected.text, (variant, prompt)
        assert reply.final["variant"] == variant
        assert reply.final["prompt_tokens"] == expected.final["prompt_tokens"]
        assert reply.final["completion_tokens"] == expected.final["completion_tokens"]
        assert len(reply.times) >= 2 and reply.times[0] < reply.times[-1]
        stats = reply.final
        assert 0 <= stats["accepted_tokens"] <= stats["draft_tokens"]
        # every round yields its accepted draft tokens plus one of the target's own
        assert stats["completion_tokens"] <= stats["accepted_tokens"] + stats["rounds"]
        # per-position counts add up to the totals where the orchestrator drafts;
        # modes that draft inside the engine report none (shape 2 x 0)
        drafted, accepted = stats["position_acceptance"].tolist()
        if variant in ("draft", "draft_logits", "ngram"):
            assert (sum(drafted), sum(accepted)) == (
                stats["draft_tokens"],
                stats["accepted_tokens"],
            )
            assert drafted and all(a <= d for d, a in zip(drafted, accepted, strict=True))
        else:
            assert drafted == accepted == []


# route -> variant (tests/fixtures/every_mode.py): every variant through the router
ROUTED = {
    "chat": "draft",
    "draft_logits": "draft_logits",
    "copy": "ngram",
    "ngram_adaptive": "ngram_adaptive",
    "medusa": "medusa",
    "eagle": "eagle",
    "long": "lookahead",
}


def test_every_variant_through_the_router_equals_baseline_at_temperature_zero(
    served, baseline
) -> None:
    """The router runs the chosen variant in its own process
    (``in_process_variants``, what ``trtspec repo`` writes): the same tokens,
    text and stats as the baseline at temperature 0, no call to the variant's
    orchestrator model, and the rollout's request log sees each request as
    over BLS (TTFT, token counts, the variant that answered)."""
    import re

    from trtspec.artifacts import rollout_state as st
    from trtspec.runtime.models.rollout_log import read_lines

    server, _, _, repo = served
    # loaded when the router started, not at each variant's first request
    loaded = re.search(r"router: variants run in process: ([^\"\n]*)", server.log_text())
    assert loaded is not None, server.log_text()[-3000:]
    assert set(ROUTED.values()) <= set(loaded.group(1).split(", ")), loaded.group(1)

    def orchestrator_calls(variant: str) -> int:
        pattern = rf'nv_inference_request_success{{model="{re.escape(variant)}",version="1"}} (\d+)'
        match = re.search(pattern, server.metrics())
        return int(match.group(1)) if match else 0

    before = {v: orchestrator_calls(v) for v in ROUTED.values()}
    sent: dict[str, tuple[str, Reply]] = {}
    for route, variant in ROUTED.items():
        for i, (prompt, expected) in enumerate(zip(PROMPTS, baseline, strict=True)):
            request_id = f"t0-{route}-{i}"
            reply = infer(server, "router", prompt, route=route, request_id=request_id)
            assert reply.error is None, (route, reply.error)
            assert reply.ids == expected.ids, (route, prompt)
            assert reply.text == expected.text, (route, prompt)
            assert (reply.final["variant"], reply.final["fallback"]) == (variant, False)
            assert reply.final["completion_tokens"] == expected.final["completion_tokens"]
            assert reply.final["prompt_tokens"] == expected.final["prompt_tokens"]
            sent[request_id] = (variant, reply)
    # in the router's process: none of these reached the orchestrator models
    assert {v: orchestrator_calls(v) for v in ROUTED.values()} == before
    path = repo / "router" / st.STATE_DIR / st.LOG_FILE
    deadline = time.monotonic() + 20
    lines: dict[str, dict] = {}
    while time.monotonic() < deadline and len(lines) < len(sent):
        lines = {r["request_id"]: r for r in read_lines(path) if r.get("request_id") in sent}
        time.sleep(0.1)
    assert sorted(lines) == sorted(sent)
    for request_id, (variant, reply) in sent.items():
        line = lines[request_id]
        assert (line["variant"], line["fallback"], line["error"]) == (variant, False, None)
        assert line["completion_tokens"] == reply.final["completion_tokens"]
        assert line["prompt_tokens"] == reply.final["prompt_tokens"]
        assert line["accepted_tokens"] == reply.final["accepted_tokens"]
        assert 0 < line["ttft_ms"] <= line["latency_ms"], line


# An answer whose prompt + output passes the spec's max_input_len (128) by far:
# before the draft loop's engines were built for max_seq_len - 1, ngram and
# draft failed it mid-stream once prompt + output passed 128.
LONG_ANSWER = 300


def test_a_long_answer_is_served_by_every_variant_as_by_the_baseline(served) -> None:
    server, spec = served[0], served[1]
    expected = infer(server, "baseline", PROMPTS[0], max_tokens=LONG_ANSWER)
    assert expected.error is None, expected.error
    assert expected.final["completion_tokens"] == LONG_ANSWER  # no early end
    assert expected.final["prompt_tokens"] + LONG_ANSWER > 2 * spec.target.max_input_len
    # ngram_short: told its engines take 64 tokens (tests/fixtures/every_mode.py),
    # it drafts while the sequence fits, then finishes without drafts
    log_mark = len(server.log_text())
    variants = [v.name for v in spec.variants] + ["ngram_short"]
    for variant in variants:
        reply = infer(server, variant, PROMPTS[0], max_tokens=LONG_ANSWER)
        assert reply.error is None, (variant, reply.error)
        assert reply.ids == expected.ids, variant
        assert reply.text == expected.text, variant
        assert reply.final["variant"] == variant
    log = server.log_text()[log_mark:]
    assert "ngram_short: the sequence (" in log, log[-3000:]
    assert "generated without drafts" in log
    for variant in ("ngram", "ngram_adaptive", "draft", "draft_logits"):
        assert f"{variant}: the sequence (" not in log  # built for it: never needed


def _prompt_ids(repo: Path, prompt: str) -> list[int]:
    from trtspec.runtime.text import Tokenizer

    return Tokenizer(_tokenizer_dir(repo)).encode(prompt)


def _tokenizer_dir(repo: Path) -> str:
    from trtspec.repo.configs import parameters_of, read_config

    return parameters_of(read_config(repo / "preprocessing" / "config.pbtxt"))["tokenizer_dir"]


@pytest.mark.parametrize(
    ("variant", "schedule"), [("ngram", "constant"), ("ngram_adaptive", "adaptive")]
)
def test_ngram_counts_are_exact(served, baseline, variant: str, schedule: str) -> None:
    from trtspec.runtime.speculate import propose_ngram, simulate_rounds

    server, _, _, repo = served
    accepted = 0
    schedule_mattered = False
    for prompt, expected in zip(PROMPTS, baseline, strict=True):
        prompt_ids = _prompt_ids(repo, prompt)
        assert len(prompt_ids) == expected.final["prompt_tokens"]
        want = simulate_rounds(
            prompt_ids,
            expected.ids,
            lambda s, k: propose_ngram(s, k, 2),
            num_draft_tokens=4,
            max_draft_len=4,
            max_tokens=MAX_TOKENS,
            schedule=schedule,
        )
        reply = infer(server, variant, prompt)
        assert reply.error is None, reply.error
        assert reply.ids == expected.ids, prompt  # the schedule never changes the output
        got = reply.final
        assert (got["rounds"], got["draft_tokens"], got["accepted_tokens"]) == (
            want.rounds,
            want.draft_tokens,
            want.accepted_tokens,
        ), prompt
        accepted += got["accepted_tokens"]
        constant = simulate_rounds(
            prompt_ids,
            expected.ids,
            lambda s, k: propose_ngram(s, k, 2),
            num_draft_tokens=4,
            max_draft_len=4,
            max_tokens=MAX_TOKENS,
        )
        schedule_mattered |= want.per_round != constant.per_round
    assert accepted > 0  # the prompts repeat themselves: lookups must hit
    # the adaptive schedule drafts differently on these prompts (a real check of it)
    assert schedule_mattered == (schedule == "adaptive")


def test_draft_model_counts_are_exact(served, baseline) -> None:
    from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine
    from trtspec.runtime.engine.sampling import SamplingParams
    from trtspec.runtime.speculate import simulate_rounds

    server, _, plan, repo = served
    draft_engine = ReferenceEngine.load(str(plan.engine(plan.variants["draft"].draft).dir))
    end_id = _end_id(repo)

    def propose(sequence, k):
        gen = draft_engine.stream(
            GenerationRequest(
                input_ids=list(sequence),
                max_new_tokens=k,
                end_id=end_id,
                sampling=SamplingParams(temperature=0.0),
            )
        )
        for _ in gen:
            pass
        return list(gen.output_ids)

    for prompt, expected in zip(PROMPTS, baseline, strict=True):
        want = simulate_rounds(
            _prompt_ids(repo, prompt),
            expected.ids,
            propose,
            num_draft_tokens=3,
            max_draft_len=4,
            max_tokens=MAX_TOKENS,
        )
        reply = infer(server, "draft", prompt)
        got = reply.final
        assert (got["rounds"], got["draft_tokens"], got["accepted_tokens"]) == (
            want.rounds,
            want.draft_tokens,
            want.accepted_tokens,
        ), prompt
        # a per-request override within max_draft_len is honoured ...
        want2 = simulate_rounds(
            _prompt_ids(repo, prompt),
            expected.ids,
            propose,
            num_draft_tokens=1,
            max_draft_len=4,
            max_tokens=MAX_TOKENS,
        )
        got2 = infer(server, "draft", prompt, num_draft_tokens=1).final
        assert (got2["rounds"], got2["draft_tokens"], got2["accepted_tokens"]) == (
            want2.rounds,
            want2.draft_tokens,
            want2.accepted_tokens,
        ), prompt
        assert got["accepted_tokens"] > 0  # the noisy draft agrees with the target often


def test_draft_logits_accept_more_at_temperature(served) -> None:
    """use_draft_logits end to end: the orchestrator fetches the draft's
    generation_logits and sends them as draft_logits, so at T > 0 the target
    keeps draft tokens by min(1, p/q); matching the target's own draw keeps
    far fewer (same prompts, same seeds, same draft engine)."""
    totals = {}
    for variant in ("draft", "draft_logits"):
        drafted = accepted = 0
        for prompt in PROMPTS:
            for seed in (1, 2):
                reply = infer(served[0], variant, prompt, temperature=1.0, seed=seed)
                assert reply.error is None, reply.error
                assert reply.final["completion_tokens"] > 0
                drafted += reply.final["draft_tokens"]
                accepted += reply.final["accepted_tokens"]
        totals[variant] = (accepted, drafted)
    (match, match_n), (by_logits, logits_n) = totals["draft"], totals["draft_logits"]
    assert match_n > 0 and logits_n > 0, totals
    assert by_logits / logits_n > 2 * match / match_n + 0.2, totals


def _end_id(repo: Path) -> int | None:
    from trtspec.runtime.text import Tokenizer

    return Tokenizer(_tokenizer_dir(repo)).end_id


def test_num_draft_tokens_above_max_draft_len_is_an_error(served) -> None:
    reply = infer(served[0], "ngram", PROMPTS[0], num_draft_tokens=9)
    assert reply.error is not None
    assert reply.error == (
        "ngram: invalid request: num_draft_tokens must be in [0, 4] "
        "(the variant's max_draft_len), got 9"
    )


def test_router_sends_the_canary_share_deterministically(served, baseline) -> None:
    from trtspec.artifacts.routing import canary_bucket

    server = served[0]
    ids = [f"req-{i}" for i in range(8)]
    expected = ["ngram" if canary_bucket(i) < 5000 else "baseline" for i in ids]
    assert 0 < expected.count("ngram") < len(ids)  # the chosen ids exercise both paths
    got = []
    for request_id in ids:
        reply = infer(server, "router", PROMPTS[0], route="code", request_id=request_id)
        assert reply.error is None, reply.error
        assert reply.text == baseline[0].text
        assert reply.final["fallback"] is False
        got.append(reply.final["variant"])
    assert got == expected
    # an unknown route goes to the default variant
    other = infer(server, "router", PROMPTS[1], route="unknown", request_id="x")
    assert other.final["variant"] == "baseline"


def test_the_router_never_takes_a_cancellation_token_from_its_client(served) -> None:
    """The router heads every chain and mints the token the models below
    watch: a client that names one (the ``trtspec_cancel`` request parameter
    a calling model passes down) is not heard, so no client can tie its
    request to another's cancel. Here the named token's flag is already up:
    taken, it would end the request at its first poll."""
    from trtspec.runtime.cancel import PARAMETER

    server = served[0]
    expected = infer(server, "baseline", PROMPTS[0], max_tokens=64)
    assert expected.error is None and len(expected.ids) == 64, expected.error
    folder = server.runtime_dir / "cancel"
    folder.mkdir(mode=0o700, exist_ok=True)
    flag = folder / "clientpickedtoken42"
    flag.touch()
    try:
        reply = infer(
            server, "router", PROMPTS[0], max_tokens=64, parameters={PARAMETER: flag.name}
        )
    finally:
        flag.unlink(missing_ok=True)
    assert reply.error is None, reply.error
    assert reply.ids == expected.ids and reply.text == expected.text


def test_router_falls_back_when_the_draft_engine_fails(served, baseline) -> None:
    server, _, plan, _ = served
    ok = infer(server, "router", PROMPTS[1], route="chat", request_id="a")
    assert (ok.final["variant"], ok.final["fallback"]) == ("draft", False)
    draft_engine = plan.variants["draft"].draft
    server.unload_model(draft_engine)
    try:
        direct = infer(server, "draft", PROMPTS[1])
        assert direct.error is not None and draft_engine in direct.error
        reply = infer(server, "router", PROMPTS[1], route="chat", request_id="b")
        assert reply.error is None, reply.error
        assert (reply.final["variant"], reply.final["fallback"]) == ("baseline", True)
        assert reply.text == baseline[1].text
    finally:
        server.load_model(draft_engine)


# EAGLE is left out: the served engine's draft count for a prompt depends on
# what earlier requests left in its KV-reuse cache (43 fresh, 45 after other
# requests, observed), so a fresh in-process run is not a fair reference.
@pytest.mark.parametrize("variant", ["medusa", "lookahead"])
def test_in_engine_counts_are_the_engines_own(served, variant: str) -> None:
    """The orchestrator reports the engine's total_draft_tokens and
    total_accepted_draft_tokens; the same engine run in process agrees."""
    from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine

    server, spec, plan, repo = served
    spec_variant = spec.variant(variant)
    options = {
        "medusa": {"medusa_choices": getattr(spec_variant, "medusa_choices", None)},
        "lookahead": {"lookahead": (2, 2, 2)},
    }[variant]
    engine = ReferenceEngine.load(str(plan.engine(plan.variants[variant].target).dir), **options)
    accepted_somewhere = 0
    for prompt in PROMPTS:
        gen = engine.stream(
            GenerationRequest(
                input_ids=_prompt_ids(repo, prompt), max_new_tokens=MAX_TOKENS, end_id=_end_id(repo)
            )
        )
        steps = sum(1 for delta in gen if delta)
        got = infer(server, variant, prompt).final
        assert (got["draft_tokens"], got["accepted_tokens"], got["rounds"]) == (
            gen.total_draft_tokens,
            gen.total_accepted_draft_tokens,
            steps,
        ), prompt
        accepted_somewhere += got["accepted_tokens"]
    assert accepted_somewhere > 0  # the tiny heads agree with the target sometimes


def test_concurrent_requests_are_served_independently(served, baseline) -> None:
    from concurrent.futures import ThreadPoolExecutor

    server = served[0]
    jobs = [("ngram", 0), ("draft", 1), ("lookahead", 2), ("router", 0)]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        replies = list(
            pool.map(
                lambda job: infer(
                    server, job[0], PROMPTS[job[1]], route="chat", request_id=f"c{job[1]}"
                ),
                jobs,
            )
        )
    for (_, index), reply in zip(jobs, replies, strict=True):
        assert reply.error is None, reply.error
        assert reply.ids == baseline[index].ids


def _stream_asking_for(server, model: str, prompt: str, outputs: list[str], route: str) -> list:
    """Every response of one streamed request that asks ``model`` for ``outputs`` only."""
    import tritonclient.grpc as grpcclient

    def tensor(name: str, array: np.ndarray, dtype: str):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(array)
        return t

    inputs = [
        tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([MAX_TOKENS], dtype=np.int32), "INT32"),
        tensor("temperature", np.array([0.0], dtype=np.float32), "FP32"),
        tensor("stream", np.array([True]), "BOOL"),
    ]
    if model == "router":
        inputs.append(tensor("route", np.array([route.encode()], dtype=np.object_), "BYTES"))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got = []
    try:
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer(
            model, inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs]
        )
        while True:
            result, error = results.get(timeout=120)
            assert error is None, error
            got.append(result)
            if bool(result.as_numpy("is_final")[0]):
                return got
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("model", ["router", "baseline"])
def test_a_client_asking_for_some_outputs_gets_exactly_those(served, baseline, model) -> None:
    # On 2.51 the stub pruning the rest freed their arrays without the GIL and
    # crashed the router at 64 streams (threads.PruningSender, docs §9).
    from concurrent.futures import ThreadPoolExecutor

    server = served[0]
    wanted = ["text_output", "is_final"]
    with ThreadPoolExecutor(4) as pool:
        runs = list(
            pool.map(
                lambda i: _stream_asking_for(server, model, PROMPTS[i % 2], wanted, "chat"),
                range(4),
            )
        )
    for i, responses in enumerate(runs):
        for result in responses:
            assert sorted(o.name for o in result.get_response().outputs) == sorted(wanted)
        text = "".join(r.as_numpy("text_output")[0].decode() for r in responses)
        assert text == baseline[i % 2].text
    after = infer(server, model, PROMPTS[0], route="chat")  # still serving, every output
    assert after.error is None and after.final["completion_tokens"] > 0


@pytest.mark.parametrize("model", ["router", "baseline"])
def test_a_client_of_token_ids_gets_the_ids_streamed_without_text(served, baseline, model) -> None:
    """Asked for ``output_ids`` and ``is_final`` only (protocol.wants_text):
    the same ids as the text client's, streamed as they come (the router and
    the orchestrator decode nothing per token), and nothing else."""
    responses = _stream_asking_for(served[0], model, PROMPTS[0], ["output_ids", "is_final"], "chat")
    for result in responses:
        assert sorted(o.name for o in result.get_response().outputs) == ["is_final", "output_ids"]
    ids = [i for r in responses for i in r.as_numpy("output_ids").reshape(-1).tolist()]
    assert ids == baseline[0].ids
    streamed = [r for r in responses if r.as_numpy("output_ids").size]
    assert len(streamed) >= 2  # more than one response carried ids: streamed
