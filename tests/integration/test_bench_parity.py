"""Cache-state parity through the real server (bench/parity.py).

A tiny-Llama repository where ``ngram`` and ``draft`` both verify on the
shared ``target_dte`` engine is benchmarked three times in ABBA order. With
the parity switched off, whichever of the two sends a prompt second finds its
blocks in ``target_dte``'s prefix cache (the asymmetry of issue 12); under
``cold`` (its own engine model per arm) and under ``warm`` (every arm primed
with the prompt) every prompt's rows carry equal ``prefix_reused_tokens`` —
under ``cold`` also at two requests in flight, where each arm sends its block
of two prompts alone (bench/blocks.py) and finds its own earlier requests of
them exactly as the other arms find theirs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tests.fixtures.every_mode import in_process_builds
from trtspec.bench.records import read_requests
from trtspec.bench.runner import BenchOptions, run_benchmark
from trtspec.cli.main import cli
from trtspec.spec import load_spec

pytestmark = pytest.mark.slow

# Distinct from the first token on, and longer than one 32-token KV block.
PROMPTS = [
    "Alpha station logs: the pump at unit three ran for forty minutes, stopped, and ran "
    "again after the valve was reset by the night crew.",
    "Bravo report: shipments of copper wire left the northern depot on Tuesday and reached "
    "the harbour warehouse two days later than planned.",
    "Charlie notes: the survey team measured the river at six points and found the water "
    "deepest near the old mill, shallowest by the ford.",
]


@pytest.fixture(scope="module", autouse=True)
def _builds_in_process() -> Iterator[None]:
    """This module's ``trtspec build`` runs its reference steps in process."""
    with in_process_builds():
        yield


@pytest.fixture(scope="module")
def parity_setup(
    tiny_llama: Path, tiny_draft: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("parity")
    (root / "routes").mkdir()
    (root / "routes" / "logs.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)
    )
    spec = root / "parity.yaml"
    spec.write_text(f"""\
name: parity
backend: reference
target: {{model: {tiny_llama}, family: llama, max_batch_size: 2, max_input_len: 256,
         max_seq_len: 512, max_num_tokens: 1024}}
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 3, num_draft_tokens: [3]}}
  - {{name: draft, mode: draft_model, draft: {{model: {tiny_draft}, family: llama}},
     max_draft_len: 3, num_draft_tokens: [3]}}
routes:
  logs: {{prompts: routes/logs.jsonl, max_tokens: 8}}
bench: {{concurrency: [1], temperatures: [0.0], warmup_requests: 0, requests_per_route: 3}}
""")
    engines, repos = root / "engines", root / "triton_repo"
    for args in (
        ["build", str(spec), "--engines", str(engines)],
        ["repo", str(spec), "--engines", str(engines), "--output", str(repos)],
    ):
        res = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert res.exit_code == 0, res.output
    return {"spec": load_spec(spec), "engines": engines, "repo": repos / "parity", "root": root}


@pytest.fixture(scope="module")
def served_repo(parity_setup: dict[str, Any]) -> Iterator[str]:
    """One server on the repository as built, for the policies that need no
    copy of it (``off`` and ``warm``); ``cold`` starts its own."""
    from trtspec.serve import Server

    with Server(parity_setup["repo"], log_path=parity_setup["root"] / "served.log") as server:
        yield server.grpc_url
    assert "Traceback" not in (parity_setup["root"] / "served.log").read_text(errors="replace")


def _bench(
    setup: dict[str, Any],
    policy: str,
    endpoint: str | None = None,
    *,
    concurrency: list[int] | None = None,
    requests: int | None = None,
    count: int = 9,
) -> list[dict[str, Any]]:
    run = setup["root"] / f"run-{policy}"
    result = run_benchmark(
        setup["spec"],
        BenchOptions(
            output_dir=run,
            repo=setup["repo"],
            endpoint=endpoint,
            engines_root=setup["engines"],
            prefix_cache=policy,
            concurrency=concurrency,
            requests=requests,
            plots=False,
            request_timeout_s=120,
        ),
    )
    assert result.summary["prefix_cache"]["policy"] == policy
    rows = [r for r in read_requests(run / "requests.jsonl") if not r["warmup"]]
    assert len(rows) == count and all(r["error"] is None for r in rows), rows
    return rows


def _reused(rows: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for r in rows:
        out.setdefault(r["sample_index"], {})[r["variant"]] = r["prefix_reused_tokens"]
    return out


def test_parity_off_reproduces_the_abba_asymmetry(
    parity_setup: dict[str, Any], served_repo: str
) -> None:
    reused = _reused(_bench(parity_setup, "off", served_repo))
    # ABBA: sample 0 runs baseline, ngram, draft; sample 1 draft, ngram, baseline.
    assert reused[0]["ngram"] == 0 and reused[0]["draft"] >= 32, reused
    assert reused[1]["draft"] == 0 and reused[1]["ngram"] >= 32, reused
    assert all(r["baseline"] == 0 for r in reused.values()), reused
    # the summary flags the cells and the report says so
    run = parity_setup["root"] / "run-off"
    summary = json.loads((run / "summary.json").read_text())
    differs = {
        c["variant"]: c["cache_state_differs"]
        for c in summary["cells"]
        if c["variant"] != "baseline"
    }
    # draft went second on samples 0 and 2, ngram on sample 1
    assert differs == {"ngram": 1, "draft": 2}, differs
    assert (
        "cache state differs: logs draft(k=3) concurrency=1 T=0: 2 of 3 prompts"
        in (run / "report.md").read_text()
    )


def test_warm_primes_every_arm_alike(parity_setup: dict[str, Any], served_repo: str) -> None:
    reused = _reused(_bench(parity_setup, "warm", served_repo))
    for sample, by_arm in reused.items():
        assert len(set(by_arm.values())) == 1, (sample, by_arm)
        assert next(iter(by_arm.values())) >= 32, (sample, by_arm)


def test_cold_gives_every_arm_the_same_cold_start(parity_setup: dict[str, Any]) -> None:
    # 4 requests over 3 prompts (0 1 2 0) at level 1, then level 2 (blocks 0 1, 2 0)
    rows = _bench(parity_setup, "cold", concurrency=[1, 2], requests=4, count=12 + 12)
    reused = _reused([r for r in rows if r["concurrency"] == 1])
    assert all(set(reused[s].values()) == {0} for s in (0, 1, 2)), reused
    # the repeat finds its arm's own first request of the prompt, on every arm alike
    assert len(set(reused[3].values())) == 1 and reused[3]["baseline"] >= 32, reused
    # At level 2 each arm finds its own level-1 requests of the same prompts,
    # and every arm finds them alike (issue 26 item 6).
    level2 = [r for r in rows if r["concurrency"] == 2]
    again = _reused(level2)
    assert sorted(again) == [0, 1, 2, 3], again
    assert all(len(set(r.values())) == 1 and r["baseline"] >= 32 for r in again.values()), again
    # a level counts one arm's requests in flight: blocks of 2 of one arm, never two arms at once
    spans = sorted(
        (r["send_time_unix"], r["send_time_unix"] + r["latency_ms"] / 1e3, r["variant"])
        for r in level2
    )
    for i, (_start, end, arm) in enumerate(spans):
        overlapping = [v for s, e, v in spans[i + 1 :] if s < end]
        assert set(overlapping) <= {arm} and len(overlapping) <= 1, spans
    order = [v for _s, _e, v in spans]
    assert (
        order == ["baseline"] * 2 + ["ngram"] * 2 + ["draft"] * 4 + ["ngram"] * 2 + ["baseline"] * 2
    ), order
    # the second arm on target_dte was served by its own engine model
    models = {r["variant"]: r["model"] for r in rows}
    assert models["ngram"] == "ngram" and models["draft"] == "draft__arm2", models
    copy = parity_setup["root"] / "run-cold" / "parity_repo"
    assert (copy / "target_dte__arm2" / "config.pbtxt").is_file()
    summary = json.loads((parity_setup["root"] / "run-cold" / "summary.json").read_text())
    assert all(not c.get("cache_state_differs") for c in summary["cells"])
    assert summary["settings"]["level_unit"] == "requests of one arm in flight"
    inflight = {c["variant"]: c["inflight_mean"] for c in summary["cells"] if c["concurrency"] == 2}
    assert all(1.0 < v <= 2.0 for v in inflight.values()), inflight
