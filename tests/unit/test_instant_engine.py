"""The instant engine (trtspec.runtime.engine.instant_model) without a server: its
token rule, draft verification and step bookkeeping; the repository swap of
trtspec.bench.instant; and benchmarks/ceiling.py's ``--help`` and budget lines.
The served contract is checked in tests/integration/test_instant_served.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.fixtures.benchmarks import benchmark_module

from trtspec.runtime.engine.instant_model import FIRST_TOKEN, _Sequence, next_token

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 387


def options(avoid: tuple[int, ...] = ()) -> dict:
    return {"avoid": avoid, "streaming": True}


def expected(prompt: list[int], n: int, avoid: tuple[int, ...] = ()) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        token = next_token(seq[-1], len(seq), VOCAB, avoid)
        seq.append(token)
        out.append(token)
    return out


def test_tokens_are_deterministic_in_range_and_avoid_end_and_pad() -> None:
    a = expected([5, 6, 7], 50)
    assert a == expected([5, 6, 7], 50)
    assert a != expected([5, 6, 8], 50)
    assert all(FIRST_TOKEN <= t < VOCAB for t in a)
    avoid = (a[0], a[3])
    b = expected([5, 6, 7], 50, avoid)
    assert not set(b) & set(avoid)


def test_one_token_per_step_until_the_requested_length() -> None:
    seq = _Sequence([5, 6, 7], 4, [], options())
    deltas = []
    while not seq.finished:
        deltas.append(seq.step(VOCAB))
    assert deltas == [[t] for t in expected([5, 6, 7], 4)]
    assert seq.out == expected([5, 6, 7], 4)
    assert seq.first_ns and seq.last_ns >= seq.first_ns


@pytest.mark.parametrize(("wrong_at", "accepted"), [(None, 3), (0, 0), (1, 1), (2, 2)])
def test_a_draft_is_verified_in_one_step_like_trtllm(wrong_at: int | None, accepted: int) -> None:
    truth = expected([9, 10], 4)
    draft = truth[:3]
    if wrong_at is not None:
        draft[wrong_at] = truth[wrong_at] + 1
    seq = _Sequence([9, 10], 4, draft, options())
    out = seq.step(VOCAB)
    # the accepted prefix plus the engine's own next token, all in one step
    assert out == truth[: accepted + 1]
    assert seq.accepted == accepted


def test_a_verified_draft_never_exceeds_the_output_length() -> None:
    truth = expected([1, 2], 3)
    seq = _Sequence([1, 2], 2, truth, options())
    assert seq.step(VOCAB) == truth[:2]
    assert seq.finished


def test_use_instant_engines_rewrites_only_the_engines(tmp_path: Path) -> None:
    from trtspec.bench.instant import STEP_PARAMETER, engine_models, use_instant_engines
    from trtspec.repo import configs

    repo = tmp_path / "repo"
    models = {"target": "engine", "draft_tok": "engine", "baseline": "orchestrator"}
    for name in models:
        config = configs.base_config(
            name, backend="python", max_batch_size=4, decoupled=name != "draft_tok"
        )
        configs.write_config(repo / name / "config.pbtxt", config)
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text("original\n")
    (repo / "trtspec-repo.json").write_text(
        json.dumps({"models": {k: {"role": v} for k, v in models.items()}})
    )
    assert engine_models(repo) == ["draft_tok", "target"]
    assert use_instant_engines(repo, 8) == ["draft_tok", "target"]
    for name in ("draft_tok", "target"):
        config = configs.read_config(repo / name / "config.pbtxt")
        assert configs.parameters_of(config)[STEP_PARAMETER] == "8"
        assert config.model_transaction_policy.decoupled == (name == "target")
        assert (
            "trtspec.runtime.engine.instant_model" in (repo / name / "1" / "model.py").read_text()
        )
    assert (repo / "baseline" / "1" / "model.py").read_text() == "original\n"
    with pytest.raises(Exception, match="negative"):
        use_instant_engines(repo, -1)


def _ceiling() -> Any:
    """benchmarks/ceiling.py as a module."""
    return benchmark_module("ceiling")


def test_ceiling_help_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ceiling.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--step-ms" in proc.stdout and "--levels" in proc.stdout


def test_ceiling_budget_lines_judge_the_8ms_rows() -> None:
    ceiling = _ceiling()
    rows = [
        {"step_ms": 8.0, "layer": "full", "level": 64, "tok_s_vs_engine": 0.95},
        {"step_ms": 8.0, "layer": "full", "level": 1, "ttft_added_ms": 1.5, "tok_added_ms": 0.1},
        {"step_ms": 0.0, "layer": "full", "level": 64, "tok_s_vs_engine": 0.1},
    ]
    assert [met for _, met in ceiling.budget_lines(rows)] == [True, False, True]
    assert [met for _, met in ceiling.budget_lines(rows[2:])] == [None, None]


def test_ceiling_names_one_router_processs_ceiling() -> None:
    ceiling = _ceiling()
    rows = [
        {"step_ms": 8.0, "layer": "engine", "level": 64, "tok_s": 2000.0},
        {"step_ms": 8.0, "layer": "full", "level": 1, "cpu_ms_per_tok_by_model": {"router": 2.0}},
        {"step_ms": 8.0, "layer": "full", "level": 64, "cpu_ms_per_tok_by_model": {"router": 0.5}},
    ]
    (line,) = ceiling.router_caps(rows)
    assert line.startswith("8 ms si 1 full x64: router 0.500 ms CPU per token")
    assert "at most ~2,000 tokens/s through one router process (engine alone here: 2,000)" in line
    # several router processes: their summed CPU carries n times one's share;
    # the tokens a response carried are named when the row has them
    rows[2].update(router_instances=2, tok_s=3000.0, resp_s=1000.0)
    (line,) = ceiling.router_caps(rows)
    assert "0.500 ms CPU per token (its 2 processes' sum), at 3.0 tokens a response" in line
    assert "at most ~4,000 tokens/s through 2 router processes" in line


def test_ceiling_relay_copies_the_engines_tensors_and_names_its_target(tmp_path: Path) -> None:
    """The bare relay layer serves the engine model's own tensors as the
    client sends them (no reshape) under the Python backend, relaying to it."""
    from trtspec.bench.instant import add_relay
    from trtspec.repo import configs

    config = configs.base_config("target", backend="python", max_batch_size=4, decoupled=True)
    tensor = config.input.add(name="return_perf_metrics", data_type=9, dims=[1])
    tensor.reshape.shape[:] = []
    configs.set_parameters(config, {"instant_step_ms": 8})
    configs.write_config(tmp_path / "target" / "config.pbtxt", config)
    assert add_relay(tmp_path, "target") == "relay"
    relay = configs.read_config(tmp_path / "relay" / "config.pbtxt")
    assert (relay.name, relay.backend, relay.max_batch_size) == ("relay", "python", 4)
    assert relay.model_transaction_policy.decoupled
    assert configs.parameters_of(relay) == {"relay_to": "target"}
    assert [t.name for t in relay.input] == ["return_perf_metrics"]
    assert not relay.input[0].HasField("reshape")
    source = (tmp_path / "relay" / "1" / "model.py").read_text()
    compile(source, "model.py", "exec")
    assert "exec(decoupled=True)" in source


def test_ceiling_floor_lines_split_the_hop_from_the_router() -> None:
    ceiling = _ceiling()
    base = {"step_ms": 8.0, "stream_interval": 1, "level": 1}
    rows = [
        {**base, "layer": "engine"},
        {**base, "layer": "relay", "ttft_added_ms": 0.7, "tok_added_ms": 0.0,
         "tok_s_vs_engine": 0.99},
        {**base, "layer": "full", "ttft_added_ms": 1.5, "tok_added_ms": 0.0,
         "tok_s_vs_engine": 0.99},
    ]  # fmt: skip
    (line,) = ceiling.floor_lines(rows)
    assert line.startswith("8 ms si 1 x1: relay adds 0.70 ms TTFT")
    assert line.endswith("the full path adds 0.80 ms TTFT over it (trtspec's router)")
    assert ceiling.floor_lines(rows[:1] + rows[2:]) == []


def test_ceiling_never_waits_for_good_on_a_silent_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that stops answering fails its request after RESPONSE_WAIT_S
    (the worker then reconnects): a cell cannot hang a run."""
    import asyncio

    ceiling = _ceiling()
    monkeypatch.setattr(ceiling, "RESPONSE_WAIT_S", 0.05)

    class Silent:
        async def __anext__(self) -> Any:
            await asyncio.sleep(30)

    load = ceiling.Load("", "relay", None, 4)
    with pytest.raises(TimeoutError, match=r"no response for 0\.05 s"):
        asyncio.run(ceiling.read_one(Silent(), ceiling.Record(sent=0.0), load))


def test_the_instant_llm_steps_every_request_to_its_max_tokens() -> None:
    from trtspec.runtime.engine.decode import GenerationRequest
    from trtspec.runtime.engine.instant_llmapi import InstantScheduler

    scheduler = InstantScheduler(0.0, vocab=50, avoid=(7, 0))
    try:
        streams = [
            scheduler.submit(GenerationRequest(input_ids=[5, 6], max_new_tokens=n))
            for n in (6, 3, 0)
        ]
        outs = [list(s) for s in streams]
    finally:
        scheduler.close()
    # one token a step, each list one step's delta, the instant engine's tokens
    expected, last = [], 6
    for length in range(2, 8):
        last = next_token(last, length, 50, (7, 0))
        expected.append(last)
    assert outs[0] == [[t] for t in expected]
    assert outs[1] == [[t] for t in expected[:3]]
    assert outs[2] == []
    assert all(7 not in d and 0 not in d for d in outs[0])
    stopped = {"now": False}
    slow = InstantScheduler(0.01, vocab=50, avoid=())
    try:
        request = GenerationRequest(input_ids=[5], max_new_tokens=1000)
        cancelled = iter(slow.submit(request, is_cancelled=lambda: stopped["now"]))
        first = next(cancelled)
        stopped["now"] = True
        rest = list(cancelled)
    finally:
        slow.close()
    assert len(first) == 1 and len(rest) < 50  # a cancelled request ends at a step


def test_instant_llmapi_repository_serves_the_instant_llm(tmp_path: Path) -> None:
    import yaml
    from tests.fixtures.tiny_model import train_tokenizer

    from trtspec.bench.instant import (
        BLS_ROUTER,
        STEP_PARAMETER,
        engine_models,
        instant_llmapi_repository,
    )
    from trtspec.repo import configs
    from trtspec.runtime.models.inprocess import PARAMETER

    tokenizer = tmp_path / "tok"
    tokenizer.mkdir()
    train_tokenizer(tokenizer)
    (tokenizer / "config.json").write_text(json.dumps({"model_type": "llama"}))
    repo = instant_llmapi_repository(tmp_path / "r", tokenizer, 8, stream_interval=4)
    assert engine_models(repo, "llmapi") == ["baseline__llmapi"]
    llm = repo / "baseline__llmapi"
    assert "trtspec.runtime.engine.instant_llmapi" in (llm / "1" / "model.py").read_text()
    assert configs.parameters_of(configs.read_config(llm / "config.pbtxt"))[STEP_PARAMETER] == "8"
    assert yaml.safe_load((llm / "1" / "model.yaml").read_text())["stream_interval"] == 4
    assert (
        "trtspec.runtime.models.llmapi_adapter"
        in (repo / "baseline" / "1" / "model.py").read_text()
    )
    routers = {
        name: configs.parameters_of(configs.read_config(repo / name / "config.pbtxt"))[PARAMETER]
        for name in ("router", BLS_ROUTER)
    }
    assert routers == {"router": "true", BLS_ROUTER: "false"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--flow", "llmapi", "--layers", "orch"], "unknown layer 'orch' for --flow llmapi"),
        (["--flow", "llmapi", "--stream-intervals", "0,4"], "--stream-intervals '0,4'"),
    ],
)
def test_ceiling_refuses_what_the_llmapi_flow_cannot_measure(argv: list[str], message: str) -> None:
    ceiling = _ceiling()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "ceiling.py"), *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    # router caps are per stream_interval: one line for each
    rows = [
        {"step_ms": 8.0, "layer": "engine", "level": 64, "tok_s": 2000.0, "stream_interval": si}
        for si in (1, 4)
    ] + [
        {
            "step_ms": 8.0,
            "layer": "full",
            "level": 64,
            "flow": "llmapi",
            "stream_interval": si,
            "cpu_ms_per_tok_by_model": {"router": 0.5 / si},
        }
        for si in (1, 4)
    ]
    lines = ceiling.router_caps(rows)
    assert [line.split(":")[0] for line in lines] == ["8 ms si 1 full x64", "8 ms si 4 full x64"]
