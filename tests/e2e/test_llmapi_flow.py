"""The LLM-API flow end to end on the tiny model, as a user runs it:
``build`` (reference engines + one LLM-argument YAML per variant, then a
cached rebuild) → ``repo`` (+ ``--check``) → ``trtspec serve`` (one real
tritonserver) → a direct streaming call to each ``<variant>__llmapi`` model
with the llmapi model's tensors → one request through the router, which runs
the adapter in its own process (Triton counts no request on the adapter
model, one on the llmapi model) → ``bench --endpoint`` →
the decisions, equality with the baseline at T=0, and acceptance reported as
not available (never 0) at the pinned 1.2.1. The direct calls show that the
CPU stand-in really speculates (NGram and Draft_Target draft and accept
tokens, as its log says) even though 1.2.1's model, and so the stand-in,
sends its acceptance outputs as zeros.

The stand-in streams as upstream's llmapi model does: every response's
``text_output`` is the whole text so far (``_create_response`` sends
``CompletionOutput.text``: triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
at b35ac1b6, 1.2.0rc2, and 044a90d2). The direct calls check that shape; the
router's answer, the bench's rows and the rollout log's line then show each
answer once (its text and token count equal to the baseline's), not
"a"+"ab"+"abc"."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from tests.fixtures.every_mode import in_process_builds
from tests.fixtures.serve_cli import wait_ready
from trtspec.bench.records import ACCEPTANCE_NOT_REPORTED, read_requests
from trtspec.cli.main import cli

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROMPTS = [
    "Passage: The bridge opened in 1932 and is 503 metres long. The bridge opened in 1932.\n"
    "Question: When did the bridge open? Quote the passage.",
    "Passage: Flight KL1234 departs at 09:15 from gate D7. Flight KL1234 departs at 09:15.\n"
    "Question: When does flight KL1234 depart? Quote the passage.",
]
VARIANTS = ("baseline", "ngram", "draft")


def _run(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, (
        f"trtspec {' '.join(args)} exited {result.exit_code}\n"
        f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result.stdout


@pytest.fixture
def workdir(tiny_llama: Path, tiny_draft: Path, tmp_path: Path):
    routes = tmp_path / "specs" / "routes"
    routes.mkdir(parents=True)
    with open(routes / "rag.jsonl", "w") as fh:
        for p in PROMPTS:
            fh.write(json.dumps({"prompt": p, "golden": p.split("\n")[0][9:40]}) + "\n")
    (tmp_path / "specs" / "tiny.yaml").write_text(f"""\
name: tiny-llmapi
backend: reference
flow: {{kind: llmapi, trtllm_version: "1.2.1", llm_args: {{stream_interval: 2}}}}
target: {{model: {tiny_llama}, family: llama, max_batch_size: 2, max_input_len: 256,
         max_seq_len: 512, max_num_tokens: 1024}}
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 3}}
  - {{name: draft, mode: draft_model, draft: {{model: {tiny_draft}, family: llama}},
     max_draft_len: 3}}
routes:
  rag: {{prompts: routes/rag.jsonl, max_tokens: 16, checks: [golden]}}
bench: {{concurrency: [1], temperatures: [0.0], warmup_requests: 0, requests_per_route: 2,
        decision: {{min_pairs: 2}}}}
""")
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


def _successes(url: str, model: str) -> int:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    try:
        stats = client.get_inference_statistics(model_name=model, as_json=True)
    finally:
        client.close()
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def tensor(name: str, value: Any, dtype: str, np_dtype: Any) -> Any:
    """A one-element input tensor."""
    import tritonclient.grpc as grpcclient

    t = grpcclient.InferInput(name, [1], dtype)
    t.set_data_from_numpy(np.array([value], dtype=np_dtype))
    return t


def _open_stream(url: str) -> tuple[Any, queue.Queue]:
    """A gRPC client with its stream started; its results land in the queue."""
    import tritonclient.grpc as grpcclient

    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    return client, responses


def _router_call(url: str, prompt: str) -> dict[str, Any]:
    """One streaming request to the router (route ``rag``): its text and the
    variant its final response names."""
    client, responses = _open_stream(url)
    try:
        client.async_stream_infer(
            "router",
            [
                tensor("text_input", prompt.encode(), "BYTES", np.object_),
                tensor("max_tokens", 16, "INT32", np.int32),
                tensor("stream", True, "BOOL", bool),
                tensor("route", b"rag", "BYTES", np.object_),
            ],
        )
        text = ""
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            text += result.as_numpy("text_output").reshape(-1)[0].decode()
            if bool(result.as_numpy("is_final").reshape(-1)[0]):
                return {"text": text, "variant": result.as_numpy("variant")[0].decode()}
    finally:
        client.stop_stream()
        client.close()


def _llmapi_call(url: str, model: str, prompt: str) -> dict[str, Any]:
    """One streaming request with the llmapi model's own tensors."""
    client, responses = _open_stream(url)
    try:
        client.async_stream_infer(
            model,
            [
                tensor("text_input", prompt.encode(), "BYTES", np.object_),
                tensor("streaming", True, "BOOL", bool),
                tensor("sampling_param_max_tokens", 16, "INT32", np.int32),
                tensor("sampling_param_return_perf_metrics", True, "BOOL", bool),
                tensor("return_finish_reason", True, "BOOL", bool),
            ],
            enable_empty_final_response=True,
        )
        text, final, pieces = "", {}, 0
        while True:
            result, error = responses.get(timeout=120)
            assert error is None, error
            out = result.get_response()
            names = {o.name for o in out.outputs}
            if "text_output" in names:
                whole = result.as_numpy("text_output").reshape(-1)[0].decode()
                # cumulative: each response's text extends the one before
                assert whole.startswith(text), (text, whole)
                pieces += whole != text
                text = whole
            for name in ("total_draft_tokens", "total_accepted_draft_tokens"):
                if name in names:
                    final[name] = int(result.as_numpy(name).reshape(-1)[0])
            if "finish_reason" in names:  # str(output.finish_reason): "None" until the end
                final.setdefault("reasons", []).append(
                    result.as_numpy("finish_reason").reshape(-1)[0].decode()
                )
            if out.parameters["triton_final_response"].bool_param:
                return {"text": text, "pieces": pieces, **final}
    finally:
        client.stop_stream()
        client.close()


def test_the_llmapi_flow_end_to_end(workdir: Path) -> None:
    spec = "specs/tiny.yaml"
    # the reference steps run in process (same argv; the subprocess path is
    # tests/e2e/test_pipeline.py's)
    with in_process_builds():
        built = json.loads(_run("build", spec, "--format", "json"))
    assert sorted(Path(p).name for p in built["files"]) == [
        "baseline.yaml",
        "draft.yaml",
        "ngram.yaml",
    ]
    ngram_args = yaml.safe_load(Path("engines/tiny-llmapi/llmapi/ngram.yaml").read_text())
    assert ngram_args["speculative_config"]["decoding_type"] == "NGram"
    again = json.loads(_run("build", spec, "--format", "json"))
    assert [s for s in again["steps"] if s["status"] == "ran"] == []

    _run("repo", spec)
    repo = Path("triton_repo/tiny-llmapi")
    _run("repo", "--check", str(repo))
    draft_yaml = yaml.safe_load((repo / "draft__llmapi" / "1" / "model.yaml").read_text())
    assert draft_yaml["speculative_config"]["decoding_type"] == "Draft_Target"
    assert draft_yaml["triton_config"]["decoupled"] is True

    log = workdir / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtspec.cli.main", "serve", str(repo), "--http-port", "0",
         "--grpc-port", "0", "--metrics-port", "0", "--format", "json", "--log-file", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        endpoints = wait_ready(proc, 300)
        grpc = endpoints.get("grpc") or endpoints.get("grpc_url")
        direct = {v: _llmapi_call(grpc, f"{v}__llmapi", PROMPTS[0]) for v in VARIANTS}
        counts = [(_successes(grpc, "baseline"), _successes(grpc, "baseline__llmapi"))]
        routed = _router_call(grpc, PROMPTS[0])
        counts.append((_successes(grpc, "baseline"), _successes(grpc, "baseline__llmapi")))
        out = _run(
            "bench", spec, "--endpoint", grpc, "--run-dir", "results/run1", "--no-plots",
            "--fixed-count",
        )  # fmt: skip
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            proc.stdout.close()
            proc.stderr.close()
    assert proc.returncode in (0, 130), f"trtspec serve exited {proc.returncode} on SIGINT"
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]

    # the llmapi models themselves: lossless at T=0, and really speculating
    assert direct["ngram"]["text"] == direct["draft"]["text"] == direct["baseline"]["text"]
    assert direct["baseline"]["text"]
    # stream_interval 2 (flow.llm_args): the baseline's 16 iterations answer at
    # the first, every second and the last: at most 9 pieces of text, not 16
    assert 2 <= direct["baseline"]["pieces"] <= 9, direct["baseline"]
    assert "total_draft_tokens" not in direct["baseline"]
    for v in VARIANTS:  # max_tokens 16 reached: "length" on the last response only
        reasons = direct[v]["reasons"]
        assert reasons[-1] in ("length", "stop") and set(reasons[:-1]) <= {"None"}, reasons
    # 1.2.1's llmapi model sends its acceptance outputs as zeros, and so does the
    # stand-in; the rounds it really ran are in the server's log
    served = log.read_text(errors="replace")
    for v in ("ngram", "draft"):
        assert direct[v]["total_draft_tokens"] == direct[v]["total_accepted_draft_tokens"] == 0
        ran = re.findall(rf"{v}__llmapi: speculation: (\d+) draft, (\d+) accepted", served)
        assert ran and all(int(d) > 0 and 0 <= int(a) <= int(d) for d, a in ran), ran

    # the router ran the baseline's adapter in its own process: straight to
    # baseline__llmapi, the adapter model itself never called; its answer is
    # the llmapi model's last whole text, once
    assert routed == {"text": direct["baseline"]["text"], "variant": "baseline"}
    assert counts[1][0] == counts[0][0] and counts[1][1] == counts[0][1] + 1, counts

    # the bench: every variant decided, equal to the baseline
    rows = [r for r in read_requests(Path("results/run1/requests.jsonl")) if not r["warmup"]]
    assert {r["variant"] for r in rows} == set(VARIANTS)
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    assert all(r["served_variant"] == r["variant"] for r in rows)
    # each answer once: the bench's text and token count per prompt equal the
    # baseline's, and the router's answer to PROMPTS[0] is the same text
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path("engines/tiny-llmapi/target/tokenizer/tokenizer.json")))
    answer_tokens = len(tok.encode(direct["baseline"]["text"], add_special_tokens=False).ids)
    by_prompt: dict[int, set[tuple[str, int]]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt_index"], set()).add(
            (r["output_text"], r["completion_tokens"])
        )
    assert all(len(answers) == 1 for answers in by_prompt.values()), by_prompt
    assert (direct["baseline"]["text"], answer_tokens) in set().union(*by_prompt.values())
    # the rollout log's line of the routed request: the answer's tokens, once
    logged = [
        json.loads(line)
        for f in repo.glob("router/rollout/requests.jsonl*")
        if not f.name.endswith(".lock")
        for line in f.read_text().splitlines()
    ]
    routed_lines = [line for line in logged if line["route"] == "rag"]
    assert routed_lines and all(
        line["completion_tokens"] == answer_tokens for line in routed_lines
    ), (routed_lines, answer_tokens)
    summary = json.loads(Path("results/run1/summary.json").read_text())
    for cell in summary["cells"]:
        if cell["variant"] == "baseline":
            continue
        assert cell["equal_rate"] == 1.0, cell
        # 1.2.1's llmapi model zeroes its acceptance outputs: not available, never 0
        assert cell["acceptance_rate"] is None and cell["draft_tokens"] is None
        assert cell["acceptance_source"] is None
        assert cell["acceptance_note"] == ACCEPTANCE_NOT_REPORTED
    assert {(d["route"], d["variant"]) for d in summary["decisions"]} == {
        ("rag", "ngram"),
        ("rag", "draft"),
    }
    assert "route=rag" in out
    report = Path("results/run1/report.md").read_text()
    assert f"rag ngram concurrency=1: acceptance {ACCEPTANCE_NOT_REPORTED}" in report
