"""The run plan without a server: arms and the k sweep, narrowing by
--variants/--routes (exact errors), ABBA order, Poisson schedules, and
reading server memory from a Triton-style metrics endpoint."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from trtspec.bench.blocks import abba
from trtspec.bench.cells import server_memory
from trtspec.bench.client import Arm, poisson_schedule
from trtspec.bench.plan import arms_for, plan_from_spec
from trtspec.errors import BenchError
from trtspec.spec import MODES, Spec

VARIANTS_DATA = [
    {
        "name": "draft",
        "mode": "draft_model",
        "draft": {"model": "org/draft", "family": "llama"},
        "max_draft_len": 6,
        "num_draft_tokens": [2, 4, 6],
    },
    {"name": "ngram", "mode": "ngram", "max_draft_len": 8, "num_draft_tokens": None},
    {"name": "medusa", "mode": "medusa", "checkpoint": "org/heads", "medusa_choices": [[0]]},
]
VARIANTS = [MODES[v["mode"]].model_validate(v) for v in VARIANTS_DATA]


def _spec(tmp_path: Path) -> Spec:
    """A validated spec (schema only: the planner needs no model on disk)."""
    (tmp_path / "r.jsonl").write_text(json.dumps({"prompt": "def f():\n"}) + "\n")
    spec = Spec.model_validate(
        {
            "name": "s",
            "target": {"model": "org/target", "family": "llama"},
            "variants": VARIANTS_DATA,
            "routes": {
                "code": {"prompts": "r.jsonl", "max_tokens": 16, "checks": ["ruff"]},
                "chat": {"prompts": "r.jsonl", "max_tokens": 8},
            },
            "bench": {
                "concurrency": [1, 4],
                "temperatures": [0.0],
                "seed": 7,
                "decision": {"min_speedup": 1.2},
            },
            "rollout": {"canary_percent": 50},
        }
    )
    spec._source_path = tmp_path / "s.yaml"
    return spec


def test_arms_sweep_k_only_for_per_request_modes() -> None:
    arms = arms_for(VARIANTS)
    assert [a.label for a in arms] == [
        "baseline",
        "draft(k=2)",
        "draft(k=4)",
        "draft(k=6)",
        "ngram(k=8)",
        "medusa",
    ]
    assert arms[1] == Arm("draft", "draft", "draft_model", True, "org/draft", 2)
    assert [a.label for a in arms_for(VARIANTS[:2], ks=[3])] == [
        "baseline",
        "draft(k=3)",
        "ngram(k=3)",
    ]


def test_k_beyond_the_engine_is_an_exact_error() -> None:
    with pytest.raises(BenchError) as exc:
        arms_for(VARIANTS[:1], ks=[7])
    assert exc.value.message == "--num-draft-tokens: 7 exceeds variant 'draft' max_draft_len 6"
    assert exc.value.hint == "sweep values up to the engine's max_draft_len (no rebuild needed)"


def test_plan_from_spec_settings_and_narrowing(tmp_path: Path) -> None:
    plan = plan_from_spec(
        _spec(tmp_path), variants=["ngram"], routes=["chat"], num_draft_tokens=[2, 4]
    )
    assert [r.name for r in plan.routes] == ["chat"]
    assert [a.label for a in plan.arms] == ["baseline", "ngram(k=2)", "ngram(k=4)"]
    s = plan.settings
    assert (s.concurrency, s.seed, s.decision["min_speedup"], s.decision["max_error_rate"]) == (
        [1, 4],
        7,
        1.2,
        0.01,
    )
    assert (s.rollout["canary_percent"], s.rollout["fallback_variant"]) == (50, "baseline")
    assert s.rollout["steps"] == [5, 25, 50, 100]  # the default ramp
    assert s.loads() == [("concurrency=1", 1, None), ("concurrency=4", 4, None)]
    assert plan.tokenizer_dir == Path("engines/s/target/tokenizer")
    full = plan_from_spec(_spec(tmp_path), request_rate=2.5)
    assert full.routes[0].checks == ["ruff"]
    assert full.settings.loads()[-1] == ("rate=2.5/s", None, 2.5)


def test_plan_from_spec_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(BenchError) as exc:
        plan_from_spec(_spec(tmp_path), variants=["eagle"])
    assert exc.value.message == "--variants: unknown variant 'eagle'"
    assert exc.value.hint == "variants in the spec: draft, ngram, medusa"
    with pytest.raises(BenchError) as exc:
        plan_from_spec(_spec(tmp_path), routes=["json"])
    assert exc.value.message == "--routes: unknown route 'json'"
    spec = _spec(tmp_path)
    spec.routes["code"].checks = ["pycompile"]
    with pytest.raises(BenchError) as exc:
        plan_from_spec(spec)
    assert exc.value.message == "routes.code.checks: unknown quality check 'pycompile'"


def test_abba_alternates_arm_order() -> None:
    arms = arms_for(VARIANTS[1:])
    assert abba(arms, 0) == arms
    assert abba(arms, 1) == list(reversed(arms))


def test_poisson_schedule_is_reproducible_with_the_right_rate() -> None:
    a = poisson_schedule(2000, 50.0, seed=3)
    assert a == poisson_schedule(2000, 50.0, seed=3)
    assert a[0] == 0.0 and all(x < y for x, y in itertools.pairwise(a))
    assert 2000 / a[-1] == pytest.approx(50.0, rel=0.08)


METRICS = """\
# HELP nv_cpu_memory_used_bytes CPU free memory (RAM), in bytes
# TYPE nv_cpu_memory_used_bytes gauge
nv_cpu_memory_used_bytes 3000000000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-a"} 1000
nv_gpu_memory_used_bytes{gpu_uuid="GPU-b"} 2000
"""


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, list[str]]]:
    body = [METRICS]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body[0].encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}", body
    finally:
        srv.shutdown()
        srv.server_close()


def test_server_memory_sources(metrics_server: tuple[str, list[str]]) -> None:
    url, body = metrics_server
    assert server_memory(url, None) == (3000, "gpu")
    body[0] = "\n".join(METRICS.splitlines()[:3]) + "\n"
    assert server_memory(f"http://{url}/metrics", None) == (3_000_000_000, "host_used")
    rss, kind = server_memory(url, os.getpid())
    assert kind == "process_rss" and rss > 1_000_000
    assert server_memory(None, None) == (None, None)


def test_until_decided_plan_and_fixed_count(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    spec.bench.decision.min_pairs = 4
    seq = plan_from_spec(spec, until_decided=True, max_requests=20).settings
    assert seq.sequential is not None
    assert seq.sequential.sizes == [4, 8, 12, 16, 20]
    assert seq.settings_dict()["until_decided"] is True
    assert seq.settings_dict()["sequential"]["confidence"] == pytest.approx(1 - 0.05 / 5)
    # --requests N is a fixed count whatever --until-decided says
    fixed = plan_from_spec(spec, until_decided=True, requests=6).settings
    assert fixed.sequential is None and fixed.requests_per_route == 6
    assert fixed.settings_dict()["until_decided"] is False
