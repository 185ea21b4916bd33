"""In-flight batching served for real: one engine-model instance, many concurrent requests.

The engine models run with ONE Triton instance: ``target`` (decoupled,
streaming) and ``target_dte`` (not decoupled, what a BLS draft loop calls).
Concurrent requests of different lengths must come back exactly as the same
engine produces each alone in process, and they must have been decoded
together: with one instance, overlapping [first scheduled, last token]
intervals (from the perf tensors) can only come from the scheduler's batch.
``target_v1`` (``gpt_model_type: V1``) serves one request at a time instead:
its intervals never overlap.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_engine_served import PROMPT, _inputs, _stream, write_engine_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served_one_instance(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory):
    from tests.fixtures.spec_checkpoints import build_engine
    from trtspec.serve import Server

    root = tmp_path_factory.mktemp("batched")
    target = build_engine(tiny_llama, root / "engines" / "target", "none", max_batch_size=8)
    dte = build_engine(
        tiny_llama,
        root / "engines" / "target_dte",
        "draft_tokens_external",
        max_draft_len=4,
        max_batch_size=8,
    )
    repo = root / "repo"
    write_engine_model(repo, "target", target, decoupled=True, instances=1)
    write_engine_model(repo, "target_dte", dte, decoupled=False, instances=1)
    write_engine_model(repo, "target_v1", target, decoupled=True, instances=1)
    _set_parameter(repo / "target_v1" / "config.pbtxt", "gpt_model_type", "V1")
    server = Server(repo, log_path=root / "server.log", env={"TRTSPEC_ENGINE_THREADS": "1"})
    server.start(timeout=180)
    try:
        yield server, target, dte
    finally:
        server.stop()
        log = server.log_text()
        assert "Traceback" not in log, server.log_tail(60)


def _set_parameter(path: Path, key: str, value: str) -> None:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    config = text_format.Parse(path.read_text(), mc.ModelConfig())
    config.parameters[key].string_value = value
    path.write_text(text_format.MessageToString(config))


def _span(result) -> tuple[int, int]:
    return (
        int(result.as_numpy("first_scheduled_time_ns").reshape(-1)[0]),
        int(result.as_numpy("last_token_time_ns").reshape(-1)[0]),
    )


def _overlapping(spans: list[tuple[int, int]]) -> int:
    """How many spans overlap another one."""
    return sum(
        any(a < d and c < b for j, (c, d) in enumerate(spans) if j != i)
        for i, (a, b) in enumerate(spans)
    )


def _run_all(work, n: int) -> dict:
    got: dict = {}

    def worker(i: int) -> None:
        got[i] = work(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    return got


def test_concurrent_streams_are_batched_and_exact(served_one_instance) -> None:
    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    server, target, _ = served_one_instance
    engine = ReferenceEngine.load(target, kv_reuse=0)
    prompts = [[*PROMPT[: 3 + 2 * i], 50 + i] * (1 + i % 3) for i in range(6)]
    lengths = [24 + 4 * i for i in range(6)]
    expected = [
        engine.generate(GenerationRequest(p, n)).output_ids
        for p, n in zip(prompts, lengths, strict=True)
    ]
    got = _run_all(
        lambda i: _stream(
            server.grpc_url, "target", _inputs(prompts[i], lengths[i], streaming=True)
        ),
        6,
    )
    spans = []
    for i in range(6):
        deltas, responses, error = got[i]
        assert error is None
        assert [t for d in deltas for t in d] == expected[i]
        spans.append(_span(responses[-1]))
    assert _overlapping(spans) >= 2, spans


def test_concurrent_draft_verifications_without_decoupled_mode(served_one_instance) -> None:
    import tritonclient.grpc as grpcclient

    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    server, _, dte = served_one_instance
    engine = ReferenceEngine.load(dte, kv_reuse=0)
    prompts = [[*PROMPT, 200 + i] * (2 + i) for i in range(5)]
    drafts = [[(7 * i + j) % 300 for j in range(1 + i % 4)] for i in range(5)]
    expected = [
        engine.generate(GenerationRequest(p, 5, draft_ids=d))
        for p, d in zip(prompts, drafts, strict=True)
    ]

    def call(i: int):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return client.infer("target_dte", _inputs(prompts[i], 5, draft=drafts[i]))
        finally:
            client.close()

    # each is one verification step; repeat rounds so some land in the same step
    spans = []
    for _ in range(3):
        got = _run_all(call, 5)
        for i in range(5):
            result = got[i]
            assert result.as_numpy("output_ids").reshape(-1).tolist() == expected[i].output_ids
            assert int(result.as_numpy("total_draft_tokens").reshape(-1)[0]) == len(drafts[i])
            spans.append(_span(result))
    assert _overlapping(spans) >= 2, spans


def test_long_prompt_with_streams_in_flight(served_one_instance) -> None:
    """A 300-token prefill joins running decodes; every output stays exact."""
    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    server, target, _ = served_one_instance
    engine = ReferenceEngine.load(target, kv_reuse=0)
    prompts = [PROMPT * 2, [3 + (i * 11) % 300 for i in range(300)]]
    expected = [engine.generate(GenerationRequest(p, 16)).output_ids for p in prompts]
    got = _run_all(
        lambda i: _stream(
            server.grpc_url,
            "target",
            _inputs(prompts[i], 16, streaming=True, extra={"end_id": np.array([[-1]], np.int32)}),
        ),
        2,
    )
    for i in range(2):
        deltas, _, error = got[i]
        assert error is None
        assert [t for d in deltas for t in d] == expected[i]


def test_v1_model_type_serves_one_request_at_a_time(served_one_instance) -> None:
    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    server, target, _ = served_one_instance
    engine = ReferenceEngine.load(target, kv_reuse=0)
    prompts = [[*PROMPT, 60 + i] for i in range(3)]
    expected = [engine.generate(GenerationRequest(p, 10)).output_ids for p in prompts]
    got = _run_all(
        lambda i: _stream(server.grpc_url, "target_v1", _inputs(prompts[i], 10, streaming=True)), 3
    )
    spans = []
    for i in range(3):
        deltas, responses, error = got[i]
        assert error is None
        assert [t for d in deltas for t in d] == expected[i]
        spans.append(_span(responses[-1]))
    assert _overlapping(spans) == 0, spans
