"""``trtspec bench`` with external arms only, against two real
``openai_reference`` servers on the tiny model's draft_tokens_external engine
(the session's ``openai_pair``, see tests/conftest.py): a target-only
baseline and a prompt-lookup (ngram) arm paired with it. Covers
rows, per-request acceptance from the metrics counters at concurrency 1, one
delta per cell at concurrency 2, chat (``messages``) and completion routes,
text equality at T=0 (prompt lookup is lossless), decisions, the report's
notes, a routing table that never routes to an external arm, and the CLI's
selection flags and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.fixtures.shared import Shared
from trtspec.bench.records import read_requests
from trtspec.cli.main import cli

pytestmark = pytest.mark.slow

COPY_PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fib",
    "Speculative decoding drafts several tokens. Speculative decoding drafts several",
]


@pytest.fixture(scope="module")
def servers(
    tiny_llama: Path, openai_pair: Shared, tmp_path_factory: pytest.TempPathFactory
) -> dict:
    pair = openai_pair.get()
    root = tmp_path_factory.mktemp("external")
    return {"root": root, "base": pair["base"], "ngram": pair["ngram"], "model": tiny_llama}


def _spec(servers: dict, **bench: object) -> Path:
    root: Path = servers["root"]
    routes = root / "routes"
    routes.mkdir(exist_ok=True)
    (routes / "copy.jsonl").write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in COPY_PROMPTS)
    )
    (routes / "chat.jsonl").write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n"
            for p in COPY_PROMPTS[:2]
        )
    )
    spec = {
        "name": "ext",
        "backend": "reference",
        "target": {
            "model": str(servers["model"]),
            "family": "llama",
            "max_batch_size": 2,
            "max_input_len": 256,
            "max_seq_len": 512,
            "max_num_tokens": 1024,
        },
        "routes": {
            "copy": {"prompts": "routes/copy.jsonl", "max_tokens": 24},
            "chat": {"prompts": "routes/chat.jsonl", "max_tokens": 16},
        },
        "bench": {
            "requests_per_route": 3,
            "warmup_requests": 1,
            "concurrency": [1],
            "external": {
                "ext_base": {"openai": servers["base"], "model": "target"},
                "ext_ngram": {
                    "openai": servers["ngram"] + "/v1",
                    "model": "target",
                    "baseline": "ext_base",
                },
            },
            **bench,
        },
    }
    path = root / "ext.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _bench(*args: str, expect: int = 0) -> tuple[str, str]:
    result = CliRunner().invoke(cli, ["bench", *args], catch_exceptions=False)
    assert result.exit_code == expect, f"{result.stdout}\n{result.stderr}"
    return result.stdout, result.stderr


def test_external_only_run(servers: dict) -> None:
    spec = _spec(servers, concurrency=[1, 2])
    run_dir = servers["root"] / "run"
    stdout, _ = _bench(
        str(spec), "--external-only", "--run-dir", str(run_dir), "--no-plots", "--timeout", "120"
    )
    rows = read_requests(run_dir / "requests.jsonl")
    measured = [r for r in rows if not r["warmup"]]
    # 2 routes × 2 arms × (3 requests at level 1 + 2 at level 2: whole blocks, at most 3)
    assert len(measured) == 20 and not [r for r in rows if r["error"]]
    assert {r["arm_kind"] for r in rows} == {"openai"}
    one = [r for r in measured if r["variant"] == "ext_ngram" and r["concurrency"] == 1]
    assert {r["acceptance_source"] for r in one} == {"metrics"}
    assert sum(r["draft_tokens"] for r in one) > 0
    assert all(r["accepted_tokens"] <= r["draft_tokens"] for r in one)
    assert all(sum(r["accepted_per_position"].values()) == r["accepted_tokens"] for r in one)
    assert {r["pairs_with"] for r in measured if r["variant"] == "ext_ngram"} == {"ext_base"}
    assert all(r["completion_tokens"] and r["ttft_ms"] and r["tpot_ms"] for r in measured)
    summary = json.loads((run_dir / "summary.json").read_text())
    cells = {(c["route"], c["variant"], c["load"]): c for c in summary["cells"]}
    for route in ("copy", "chat"):
        for load in ("concurrency=1", "concurrency=2"):
            cell = cells[(route, "ext_ngram", load)]
            assert cell["acceptance_source"] == "metrics", cell
            assert cell["acceptance_rate"] is not None
            assert cell["mean_accepted_length"] >= 1.0
            assert cell["equal_rate"] == 1.0  # prompt lookup is lossless at T=0
            assert cell["pairs"] == (3 if load == "concurrency=1" else 2), cell
            assert cell["speedup"] is not None
    assert cells[("copy", "ext_ngram", "concurrency=2")]["acceptance_note"] == (
        "one delta over the whole cell (concurrency > 1)"
    )
    decisions = {(d["route"], d["variant"]): d for d in summary["decisions"]}
    assert set(decisions) == {("copy", "ext_ngram"), ("chat", "ext_ngram")}
    assert decisions[("copy", "ext_ngram")]["baseline"] == "ext_base"
    # the Triton router never routes to an external arm
    assert {e["variant"] for e in summary["routing"]["routes"].values()} == {"baseline"}
    assert "route=copy  ext_base " in stdout and " ext_ngram " in stdout
    report = (run_dir / "report.md").read_text()
    assert "external arm ext_ngram: " + servers["ngram"] in report
    assert "acceptance from vllm Prometheus counter deltas" in report
    assert (
        "routes chat: external arms send `messages` and the server renders its own chat template"
    ) in report
    run = json.loads((run_dir / "run.json").read_text())
    assert run["server"] == {"endpoint": None, "repo": None, "isolate": False}
    assert run["external"]["arms"]["ext_ngram"]["acceptance_counters"] == "vllm"
    assert run["external"]["arms"]["ext_base"]["metrics"] is None


def test_baseline_without_counters_and_narrowing(servers: dict) -> None:
    """Pointing the speculative arm at the target-only server: no counters, so
    acceptance is null with the reason, and the arm still gets a decision."""
    spec = _spec(servers)
    data = yaml.safe_load(spec.read_text())
    data["bench"]["external"]["ext_ngram"]["openai"] = servers["base"]
    spec.write_text(yaml.safe_dump(data))
    run_dir = servers["root"] / "run-nocounters"
    _, stderr = _bench(
        str(spec),
        "--external-only",
        "--external",
        "ext_ngram",
        "--routes",
        "copy",
        "--run-dir",
        str(run_dir),
        "--no-plots",
    )
    assert (
        "bench: external arm ext_ngram: acceptance unknown (no speculative-decoding "
        "counters" in stderr
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    cell = next(c for c in summary["cells"] if c["variant"] == "ext_ngram")
    assert cell["acceptance_rate"] is None and cell["acceptance_source"] is None
    assert cell["acceptance_note"].startswith("no speculative-decoding counters")
    assert cell["equal_rate"] == 1.0  # the same server: same text


def test_cli_errors(servers: dict) -> None:
    spec = _spec(servers)
    result = CliRunner().invoke(cli, ["bench", str(spec), "--external", "nope", "--external-only"])
    assert result.exit_code == 1
    assert result.stderr == (
        "Error: --external: no external arm named 'nope'\n"
        "Hint: external arms in the spec: ext_base, ext_ngram\n"
    )
    result = CliRunner().invoke(cli, ["bench", str(spec), "--external", "none", "--external-only"])
    assert result.exit_code == 2
    assert "--external none and --external-only leave no arm to bench" in result.stderr
    data = yaml.safe_load(spec.read_text())
    data["bench"]["external"]["ext_base"]["model"] = "missing-model"
    spec.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        cli, ["bench", str(spec), "--external-only", "--run-dir", str(servers["root"] / "never")]
    )
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: external arm 'ext_base': {servers['base']} does not serve model "
        "'missing-model'\nHint: set bench.external.ext_base.model to one of: target\n"
    )


def _post(url: str, body: dict) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_openai_reference_answers_whole_and_rejects_bad_requests(servers: dict) -> None:
    import urllib.request

    base = servers["ngram"]
    status, body = _post(
        base + "/v1/completions",
        {"model": "target", "prompt": COPY_PROMPTS[0], "max_tokens": 8, "temperature": 0},
    )
    assert status == 200 and body["object"] == "text_completion"
    assert (
        body["usage"]["completion_tokens"] == 8 and body["choices"][0]["finish_reason"] == "length"
    )
    status, chat = _post(
        base + "/v1/chat/completions",
        {
            "model": "target",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 4,
            "temperature": 0,
        },
    )
    assert status == 200 and chat["choices"][0]["message"]["role"] == "assistant"
    assert _post(base + "/v1/completions", {"model": "other", "prompt": "x"}) == (
        404,
        {
            "error": {
                "message": "The model `other` does not exist.",
                "type": "NotFoundError",
                "param": None,
                "code": 404,
            }
        },
    )
    status, err = _post(
        base + "/v1/completions", {"model": "target", "prompt": "x", "max_tokens": 0}
    )
    assert status == 400 and err["error"]["message"] == (
        "max_tokens: must be a positive integer, got 0"
    )
    status, err = _post(
        base + "/v1/completions", {"model": "target", "prompt": "x " * 400, "max_tokens": 8}
    )
    assert status == 400 and "exceeds maximum input length" in err["error"]["message"]
    with urllib.request.urlopen(base + "/health", timeout=10) as resp:
        assert resp.status == 200
    with urllib.request.urlopen(servers["base"] + "/metrics", timeout=10) as resp:
        page = resp.read().decode()
    # a target-only server has no spec-decode counters, like vLLM without a speculative config
    assert "vllm:generation_tokens_total" in page and "spec_decode" not in page
