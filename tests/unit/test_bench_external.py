# ruff: noqa: E501  (exact user-facing messages read best on one line)
"""External arms without a server: the spec's ``bench.external`` rules (exact
messages with file:line), arms built from it, pairing in the summary (an
external speculative arm against its named baseline, text equality where no
token ids exist), decisions, a routing table that ignores external arms, and
the report's notes."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from trtspec.bench.decide import decide
from trtspec.bench.external import external_arms
from trtspec.bench.external_notes import external_notes
from trtspec.bench.summary import DEFAULT_DECISION, summarize_rows
from trtspec.errors import BenchError, SpecError
from trtspec.spec import load_spec

SPEC = """\
name: t
target:
  model: org/target
  family: llama
variants:
  - name: ngram
    mode: ngram
    max_draft_len: 4
bench:
  external:
{arms}
"""


def _issues(tmp_path: Path, arms: str) -> list[str]:
    path = tmp_path / "s.yaml"
    path.write_text(SPEC.format(arms=textwrap.indent(textwrap.dedent(arms), "    ")))
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return [line.replace(str(path), "s.yaml") for line in err.value.issues]


def test_valid_external_section(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        SPEC.format(
            arms=textwrap.indent(
                textwrap.dedent("""\
        vllm_base: {openai: "http://127.0.0.1:8000", model: target}
        vllm_eagle: {openai: "http://127.0.0.1:8001/v1", model: target, baseline: vllm_base,
                     metrics: "http://127.0.0.1:8001/metrics", api_key_env: VLLM_KEY}
        """),
                "    ",
            )
        )
    )
    spec = load_spec(path)
    assert spec.bench.external["vllm_eagle"].baseline == "vllm_base"
    arms = external_arms(spec.bench.external)
    assert [(a.variant, a.speculative, a.baseline, a.mode) for a in arms] == [
        ("vllm_base", False, None, "none"),
        ("vllm_eagle", True, "vllm_base", "external"),
    ]
    assert arms[1].openai is not None
    assert (arms[1].openai.url, arms[1].openai.metrics_url, arms[1].openai.api_key_env) == (
        "http://127.0.0.1:8001",
        "http://127.0.0.1:8001/metrics",
        "VLLM_KEY",
    )
    assert arms[0].openai is not None and arms[0].openai.metrics_url is None
    # narrowing to a speculative arm brings its baseline along
    assert [a.variant for a in external_arms(spec.bench.external, ["vllm_eagle"])] == [
        "vllm_base",
        "vllm_eagle",
    ]
    with pytest.raises(BenchError) as err:
        external_arms(spec.bench.external, ["vllm_egle"])
    assert (err.value.message, err.value.hint) == (
        "--external: no external arm named 'vllm_egle'",
        "external arms in the spec: vllm_base, vllm_eagle",
    )


def test_default_metrics_url(tmp_path: Path) -> None:
    arms = external_arms(
        {
            "b": {"openai": "http://127.0.0.1:1/v1/", "model": "m"},
            "s": {"openai": "http://127.0.0.1:2/", "model": "m", "baseline": "b"},
        }
    )
    assert arms[1].openai is not None and arms[1].openai.metrics_url == "http://127.0.0.1:2/metrics"


def test_pairing_rules(tmp_path: Path) -> None:
    assert _issues(
        tmp_path,
        """\
        base: {openai: "http://127.0.0.1:8000", model: target}
        a: {openai: "http://127.0.0.1:8001", model: target, baseline: bas}
        b: {openai: "http://127.0.0.1:8001", model: target, baseline: a}
        c: {openai: "http://127.0.0.1:8001", model: target, baseline: c}
        d: {openai: "http://127.0.0.1:8001", model: target, baseline: baseline}
        """,
    ) == [
        "s.yaml:12:67: bench.external.a.baseline: no external arm named 'bas'; did you mean 'base'?",
        "s.yaml:13:67: bench.external.b.baseline: 'a' has a baseline of its own ('bas'); a baseline must be a target-only arm without `baseline`",
        "s.yaml:14:67: bench.external.c.baseline: an arm cannot be its own baseline; name its server's target-only twin, or remove `baseline` to make this a baseline",
        "s.yaml:15:67: bench.external.d.baseline: no external arm named 'baseline'; external arms pair with another external arm (their own server's target-only twin); trtspec's Triton arms sit beside them in the same report",
    ]


def test_names_urls_and_unknown_keys(tmp_path: Path) -> None:
    assert _issues(
        tmp_path,
        """\
        ngram: {openai: "http://127.0.0.1:8000", model: target}
        router: {openai: "grpc://127.0.0.1:8001", model: target, metrics: "nope"}
        """,
    ) == [
        "s.yaml:11:5: bench.external.ngram: 'ngram' is also a variant name; give the external arm its own name (rows and decisions are keyed by arm name)",
        "s.yaml:12:5: bench.external.router: 'router' is reserved for trtspec's own models; pick another name",
        "s.yaml:12:22: bench.external.router.openai: 'grpc://127.0.0.1:8001' is not an http(s) URL; write it like http://127.0.0.1:8000",
        "s.yaml:12:71: bench.external.router.metrics: 'nope' is not an http(s) URL; write it like http://127.0.0.1:8000",
    ]
    assert _issues(
        tmp_path,
        """\
        base: {openai: "http://127.0.0.1:8000", modl: target}
        """,
    ) == [
        "s.yaml:11:5: bench.external.base: missing required key 'model'; add it",
        "s.yaml:11:45: bench.external.base.modl: unknown key 'modl'; did you mean 'model'?",
    ]


# -- summary, decisions, routing -------------------------------------------------------------


def _row(
    variant: str,
    sample: int,
    latency: float,
    *,
    kind: str = "triton",
    pairs: str | None = None,
    text: str = "same",
    ids: str | None = "h",
) -> dict[str, Any]:
    return {
        "route": "r",
        "variant": variant,
        "num_speculative_tokens": None,
        "load": "concurrency=1",
        "concurrency": 1,
        "temperature": 0.0,
        "warmup": False,
        "sample_index": sample,
        "prompt_index": sample,
        "speculative": pairs is not None,
        "arm_kind": kind,
        "pairs_with": pairs,
        "error": None,
        "completion_tokens": 20,
        "latency_ms": latency,
        "ttft_ms": 5.0,
        "tpot_ms": 1.0,
        "tokens_per_second": 1.0,
        "send_time_unix": 0.0,
        "text_hash": text,
        "output_ids_hash": ids,
        "draft_tokens": 8 if kind == "openai" and pairs else 0,
        "accepted_tokens": 6 if kind == "openai" and pairs else 0,
        "rounds": 2 if kind == "openai" and pairs else 0,
        "acceptance_source": "metrics" if kind == "openai" and pairs else None,
        "quality": {},
    }


def test_external_pairs_with_its_own_baseline_and_is_never_routed() -> None:
    rows = []
    for i in range(6):
        rows += [
            _row("baseline", i, 100.0),
            _row("ngram", i, 99.0, pairs="baseline"),
            _row("vbase", i, 200.0, kind="openai", ids=None),
            _row(
                "vspec",
                i,
                100.0,
                kind="openai",
                pairs="vbase",
                ids=None,
                text="same" if i else "different",
            ),
        ]
    cells = {c["variant"]: c for c in summarize_rows(rows)}
    assert [c for c in cells] == ["baseline", "ngram", "vbase", "vspec"]
    assert cells["vspec"]["pairs_with"] == "vbase" and cells["vspec"]["pairs"] == 6
    assert cells["vspec"]["speedup"]["point"] == pytest.approx(2.0)
    assert cells["vspec"]["equal_rate"] == pytest.approx(5 / 6)  # text compared
    assert cells["vspec"]["acceptance_rate"] == 0.75
    assert cells["vspec"]["mean_accepted_length"] == 4.0  # 1 + accepted/drafts, vLLM's formula
    assert cells["vspec"]["acceptance_source"] == "metrics"
    assert cells["vbase"]["speedup"] is None and cells["vbase"]["pairs_with"] is None
    decisions, routing = decide(list(cells.values()), dict(DEFAULT_DECISION))
    by = {d["variant"]: d for d in decisions}
    assert set(by) == {"ngram", "vspec"}
    assert by["vspec"]["baseline"] == "vbase" and by["vspec"]["arm_kind"] == "openai"
    assert by["vspec"]["headline"]["latency_change"]["point"] == pytest.approx(-0.5)
    assert by["vspec"]["decision"] == "exclude"  # text differs from its baseline at T=0
    # vspec is 2x faster but external: the Triton router cannot route to it
    assert routing["routes"]["r"]["variant"] == "baseline"


def test_rows_without_new_fields_keep_pairing_with_baseline() -> None:
    """Runs written before external arms existed re-render unchanged."""
    rows = []
    for i in range(3):
        for row in (_row("baseline", i, 100.0), _row("ngram", i, 50.0, pairs="baseline")):
            row.pop("arm_kind")
            row.pop("pairs_with")
            rows.append(row)
    cells = {c["variant"]: c for c in summarize_rows(rows)}
    assert cells["ngram"]["pairs_with"] == "baseline" and cells["ngram"]["pairs"] == 3
    assert cells["ngram"]["arm_kind"] == "triton"


def test_report_notes() -> None:
    summary = {
        "external": {
            "arms": {
                "vbase": {"openai": "http://127.0.0.1:1", "model": "m", "baseline": None},
                "vspec": {
                    "openai": "http://127.0.0.1:2",
                    "model": "m",
                    "baseline": "vbase",
                    "metrics": "http://127.0.0.1:2/metrics",
                    "acceptance_counters": "vllm",
                },
                "sg": {
                    "openai": "http://127.0.0.1:3",
                    "model": "m",
                    "baseline": "vbase",
                    "acceptance_counters": None,
                    "acceptance_note": "SGLang exposes only gauges",
                },
            },
            "chat_routes": ["chat"],
        },
        "cells": [],
    }
    notes = external_notes(summary)
    assert notes[0] == "external arm vbase: http://127.0.0.1:1 model m (a baseline)"
    assert notes[1] == (
        "external arm vspec: http://127.0.0.1:2 model m, compared with vbase; acceptance from vllm "
        "Prometheus counter deltas (http://127.0.0.1:2/metrics; server-wide counters: exact only while "
        "nothing else sends it traffic)"
    )
    assert notes[2] == (
        "external arm sg: http://127.0.0.1:3 model m, compared with vbase; acceptance "
        "unknown: SGLang exposes only gauges"
    )
    assert notes[3].startswith(
        "routes chat: external arms send `messages` and the server "
        "renders its own chat template, so their prompt text is not "
        "byte-identical to the Triton arms'"
    )
    assert external_notes({"cells": []}) == []
