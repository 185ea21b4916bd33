"""The reference engine served for real: tritonserver + Python backend + tritonclient.

A repository with two engine models built from the tiny Llama — ``target``
(decoupled, 2 instances, streams) and ``target_dte`` (``draft_tokens_external``,
not decoupled, what a BLS draft loop calls) — runs under the tritonserver
bundled in nvidia-pytriton. Requests go through ``tritonclient.grpc``; tokens
and stats are checked against the same engine run in process.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow

# The bundled stub's embedded interpreter ignores PYTHONPATH (its sys.path lacks
# the entries serve.wheel_env sets), so the shim adds them before importing.
MODEL_PY = """import os
import sys

for _entry in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
    if _entry and _entry not in sys.path:
        sys.path.insert(0, _entry)

from trtspec.runtime.engine.triton_model import TritonPythonModel  # noqa: E402,F401
"""

PROMPT = [5, 17, 42, 99, 7, 250, 31, 8, 64, 12, 77, 3]


def write_engine_model(
    repo: Path, name: str, engine: Path, *, decoupled: bool, instances: int
) -> None:
    """One engine model folder (config.pbtxt from a ModelConfig + the model.py shim).

    The only place this test builds configs, so it can follow trtspec.repo's builders."""
    from trtspec.repo import configs
    from trtspec.runtime.contract import engine_contract

    contract = engine_contract("1.1.0")
    config = configs.base_config(
        name,
        backend="python",
        max_batch_size=4,
        decoupled=decoupled,
        instances=instances,
        inputs=contract.inputs,
        outputs=contract.outputs,
        parameters={
            "gpt_model_path": str(engine),
            "exclude_input_in_output": True,
            "enable_kv_cache_reuse": True,
        },
    )
    configs.write_config(repo / name / "config.pbtxt", config)
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "1" / "model.py").write_text(MODEL_PY)


@pytest.fixture(scope="module")
def served(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory):
    from tests.fixtures.spec_checkpoints import build_engine
    from trtspec.serve import Server

    root = tmp_path_factory.mktemp("served")
    target = build_engine(tiny_llama, root / "engines" / "target", "none")
    dte = build_engine(
        tiny_llama, root / "engines" / "target_dte", "draft_tokens_external", max_draft_len=4
    )
    repo = root / "repo"
    write_engine_model(repo, "target", target, decoupled=True, instances=2)
    write_engine_model(repo, "target_dte", dte, decoupled=False, instances=1)
    # the instant engine (benchmarks/ceiling.py) behind the same contract, 2 ms steps
    for name, decoupled in (("instant", True), ("instant_dte", False)):
        write_engine_model(repo, name, target, decoupled=decoupled, instances=1)
        (repo / name / "1" / "model.py").write_text(
            MODEL_PY.replace("triton_model", "instant_model")
        )
    from trtspec.bench.instant import use_instant_engines

    (repo / "trtspec-repo.json").write_text(
        '{"models": {"instant": {"role": "engine"}, "instant_dte": {"role": "engine"}}}'
    )
    use_instant_engines(repo, 2)
    # that manifest only named the engines to swap; a served repository's is
    # complete (trtspec repo), and the server would read this one
    (repo / "trtspec-repo.json").unlink()
    server = Server(repo, log_path=root / "server.log", env={"TRTSPEC_ENGINE_THREADS": "1"})
    server.start(timeout=180)
    try:
        yield server, target, dte
    finally:
        server.stop()
        log = server.log_text()
        assert "Traceback" not in log, server.log_tail(60)


def _inputs(
    ids: list[int],
    output_len: int,
    *,
    streaming: bool = False,
    draft: list[int] | None = None,
    extra: dict | None = None,
) -> list:
    import tritonclient.grpc as grpcclient

    def tensor(name: str, value: np.ndarray) -> grpcclient.InferInput:
        t = grpcclient.InferInput(
            name,
            list(value.shape),
            "BOOL"
            if value.dtype == np.bool_
            else {
                np.dtype(np.int32): "INT32",
                np.dtype(np.float32): "FP32",
                np.dtype(np.uint64): "UINT64",
            }[value.dtype],
        )
        t.set_data_from_numpy(value)
        return t

    tensors = [
        tensor("input_ids", np.array([ids], dtype=np.int32)),
        tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
        tensor("request_output_len", np.array([[output_len]], dtype=np.int32)),
        tensor("streaming", np.array([[streaming]], dtype=np.bool_)),
        tensor("return_perf_metrics", np.array([[True]], dtype=np.bool_)),
    ]
    if draft is not None:
        tensors.append(tensor("draft_input_ids", np.array([draft], dtype=np.int32)))
    for name, value in (extra or {}).items():
        tensors.append(tensor(name, value))
    return tensors


def _stream(url: str, model: str, inputs: list) -> tuple[list[list[int]], list, str | None]:
    """(token deltas, responses, error) of one streaming request."""
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        deltas, responses = [], []
        while True:
            result, error = results.get(timeout=120)
            if error is not None:
                return deltas, responses, str(error)
            final = result.get_response().parameters["triton_final_response"].bool_param
            ids = result.as_numpy("output_ids")
            if ids is not None and ids.size:
                deltas.append([int(t) for t in ids.reshape(-1)])
                responses.append(result)
            if final:
                return deltas, responses, None
    finally:
        client.stop_stream()
        client.close()


def test_streaming_matches_in_process_engine(served) -> None:
    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    server, target, _ = served
    expected = ReferenceEngine.load(target).generate(GenerationRequest(PROMPT, 12)).output_ids
    deltas, responses, error = _stream(
        server.grpc_url, "target", _inputs(PROMPT, 12, streaming=True)
    )
    assert error is None
    assert len(deltas) == 12  # target-only: one token per step, one response per step
    assert [t for d in deltas for t in d] == expected
    last = responses[-1]
    assert int(last.as_numpy("total_draft_tokens").reshape(-1)[0]) == 0
    first_ns = int(last.as_numpy("first_token_time_ns").reshape(-1)[0])
    assert int(last.as_numpy("arrival_time_ns").reshape(-1)[0]) <= first_ns
    assert first_ns <= int(last.as_numpy("last_token_time_ns").reshape(-1)[0])


def test_draft_verification_and_stats(served) -> None:
    import tritonclient.grpc as grpcclient

    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine

    server, target, _ = served
    truth = ReferenceEngine.load(target).generate(GenerationRequest(PROMPT, 8)).output_ids
    draft = [*truth[:2], (truth[2] + 1) % 384, truth[3]]  # two right, then a miss
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("target_dte", _inputs(PROMPT, 5, draft=draft))
    ids = result.as_numpy("output_ids")
    assert ids.shape == (1, 1, 3)
    assert ids.reshape(-1).tolist() == truth[:3]  # accepted prefix + the target's own token
    assert result.as_numpy("sequence_length").reshape(-1).tolist() == [3]
    assert result.as_numpy("total_draft_tokens").reshape(-1).tolist() == [4]
    assert result.as_numpy("total_accepted_draft_tokens").reshape(-1).tolist() == [2]
    assert result.as_numpy("acceptance_rate").reshape(-1).tolist() == [0.5]
    # The next round re-sends the whole sequence: its prefix comes from the KV cache.
    seq = PROMPT + truth[:3]
    result = client.infer("target_dte", _inputs(seq, 4, draft=truth[3:6]))
    assert result.as_numpy("output_ids").reshape(-1).tolist() == truth[3:7]
    # 12 prompt + 2 accepted tokens were cached: less than one 32-token block.
    assert result.as_numpy("kv_cache_reused_blocks").reshape(-1).tolist() == [0]
    long_prompt = [3 + (i * 7) % 300 for i in range(70)]
    first = client.infer("target_dte", _inputs(long_prompt, 1))
    again = client.infer(
        "target_dte", _inputs(long_prompt + first.as_numpy("output_ids").reshape(-1).tolist(), 1)
    )
    assert again.as_numpy("kv_cache_reused_blocks").reshape(-1).tolist() == [70 // 32]
    assert again.as_numpy("kv_cache_alloc_total_blocks").reshape(-1).tolist() == [3]
    client.close()


def test_bad_requests_get_errors_and_model_keeps_serving(served) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server, _, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as err:
        client.infer("target_dte", _inputs(PROMPT, 7, draft=[1, 2, 3, 4, 5, 6]))
    assert "Number of draft tokens (6) is larger than maximum number of draft tokens (4)" in str(
        err.value
    )
    with pytest.raises(InferenceServerException) as err:
        client.infer("target_dte", _inputs([3 + i % 300 for i in range(597)], 4))
    assert "Prompt length (597) exceeds maximum input length (512)." in str(err.value)
    with pytest.raises(InferenceServerException) as err:
        client.infer("target_dte", _inputs(PROMPT, 4, streaming=True))
    assert "Streaming is only supported if model is deployed using decoupled mode." in str(
        err.value
    )
    missing = [t for t in _inputs(PROMPT, 4) if t.name() != "request_output_len"]
    with pytest.raises(InferenceServerException) as err:
        client.infer("target_dte", missing)
    assert "request_output_len" in str(err.value)
    _, _, error = _stream(
        server.grpc_url,
        "target",
        _inputs(
            PROMPT,
            4,
            streaming=True,
            extra={
                "lookahead_window_size": np.array([[2]], np.int32),
                "lookahead_ngram_size": np.array([[2]], np.int32),
                "lookahead_verification_set_size": np.array([[1]], np.int32),
            },
        ),
    )
    assert error is not None and "not built for lookahead decoding" in error
    ok = client.infer("target_dte", _inputs(PROMPT, 3))
    assert ok.as_numpy("sequence_length").reshape(-1).tolist() == [3]
    client.close()


def test_concurrent_streams(served) -> None:
    from trtspec.runtime.engine import GenerationRequest, ReferenceEngine, SamplingParams

    server, target, _ = served
    engine = ReferenceEngine.load(target)
    prompts = [[*PROMPT[: 4 + i], 100 + i] for i in range(4)]
    expected = [
        engine.generate(
            GenerationRequest(p, 10, sampling=SamplingParams(temperature=0.8, top_k=50, seed=7 + i))
        ).output_ids
        for i, p in enumerate(prompts)
    ]
    got: dict[int, tuple] = {}

    def worker(i: int) -> None:
        extra = {
            "temperature": np.array([[0.8]], np.float32),
            "runtime_top_k": np.array([[50]], np.int32),
            "seed": np.array([[7 + i]], np.uint64),
        }
        got[i] = _stream(
            server.grpc_url, "target", _inputs(prompts[i], 10, streaming=True, extra=extra)
        )

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    for i in range(4):
        deltas, _, error = got[i]
        assert error is None
        assert [t for d in deltas for t in d] == expected[i]


def test_instant_engine_honours_the_engine_contract(served) -> None:
    """The instant engine answers the reference engine's tensors: one token
    per step when streaming (deterministic, never end_id/pad_id), a draft
    verified in one step, perf metrics, and the same refusal words."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    from trtspec.runtime.engine.config import read_engine_config
    from trtspec.runtime.engine.instant_model import next_token

    server, target, _ = served
    vocab = read_engine_config(target).vocab_size
    end_pad = {"end_id": np.array([[2]], np.int32), "pad_id": np.array([[0]], np.int32)}

    def truth(prompt: list[int], n: int) -> list[int]:
        seq = list(prompt)
        for _ in range(n):
            seq.append(next_token(seq[-1], len(seq), vocab, (2, 0)))
        return seq[len(prompt) :]

    deltas, responses, error = _stream(
        server.grpc_url, "instant", _inputs(PROMPT, 6, streaming=True, extra=end_pad)
    )
    assert error is None
    assert deltas == [[t] for t in truth(PROMPT, 6)]
    last = responses[-1]
    assert last.as_numpy("first_token_time_ns").reshape(-1)[0] > 0
    assert last.as_numpy("total_draft_tokens").reshape(-1).tolist() == [0]

    client = grpcclient.InferenceServerClient(server.grpc_url)
    want = truth(PROMPT, 4)
    draft = [want[0], want[1], want[2] + 1]  # the third is wrong
    got = client.infer("instant_dte", _inputs(PROMPT, 4, draft=draft, extra=end_pad))
    # step 1: two drafts accepted + the engine's own third; step 2: the fourth
    assert got.as_numpy("output_ids").reshape(-1).tolist() == want
    assert got.as_numpy("total_accepted_draft_tokens").reshape(-1).tolist() == [2]
    whole = client.infer("instant_dte", _inputs(PROMPT, 5, extra=end_pad))
    assert whole.as_numpy("output_ids").reshape(-1).tolist() == truth(PROMPT, 5)
    assert whole.as_numpy("sequence_length").reshape(-1).tolist() == [5]
    with pytest.raises(InferenceServerException) as err:
        client.infer("instant_dte", _inputs(PROMPT, 4, streaming=True))
    assert "Streaming is only supported if model is deployed using decoupled mode." in str(
        err.value
    )
    bad = {"temperature": np.array([[-1.0]], np.float32)}
    with pytest.raises(InferenceServerException) as err:
        client.infer("instant_dte", _inputs(PROMPT, 4, extra=bad))
    assert "temperature must be a finite number >= 0" in str(err.value)
    client.close()
