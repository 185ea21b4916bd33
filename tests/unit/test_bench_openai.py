"""The OpenAI-compatible client's parsing: SSE framing (WHATWG rules: LF, CRLF,
comments as keep-alives, partial lines across reads), the chunk streams of
vLLM and trtllm-serve hand-written in tests/data/sse_handwritten/ (typed
from their sources, named in each file's comment header; not recordings of
a running server), the per-request verdicts, and
the Prometheus counters behind metrics-based acceptance (vLLM, trtllm-serve,
SGLang pages)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtspec.bench.client import Arm, Job
from trtspec.bench.openai_client import (
    OpenAIEndpoint,
    OpenAIWorker,
    SseEvent,
    SseParser,
    StreamState,
    base_url,
    request_body,
)
from trtspec.bench.openai_metrics import (
    Counts,
    acceptance_fields,
    attach_cell_acceptance,
    cell_sample,
    counts,
    detect,
    parse_prometheus,
)

SSE = Path(__file__).resolve().parents[1] / "data" / "sse_handwritten"


def _events(raw: bytes, step: int | None = None) -> tuple[list[SseEvent], SseParser]:
    parser = SseParser()
    if step is None:
        return parser.feed(raw), parser
    out: list[SseEvent] = []
    for i in range(0, len(raw), step):
        out += parser.feed(raw[i : i + step])
    return out, parser


def _state(name: str, api: str = "chat", step: int | None = None) -> StreamState:
    events, _ = _events((SSE / name).read_bytes(), step)
    state = StreamState(api)
    for n, event in enumerate(events):
        state.apply(event, 1000 + n)
    return state


@pytest.mark.parametrize("step", [None, 1, 7])
def test_vllm_chat_stream_any_read_boundaries(step: int | None) -> None:
    state = _state("vllm_chat.sse", step=step)
    assert state.text == "Hello, wörld!"
    assert state.first_text_ns == 1001  # the role chunk's empty content is not the first token
    assert state.usage == {"prompt_tokens": 21, "total_tokens": 25, "completion_tokens": 4}
    assert state.finish_reason == "length"
    assert state.done and state.error is None
    assert state.chunks == 5
    assert OpenAIWorker._verdict(state) is None


def test_vllm_completions_stream() -> None:
    state = _state("vllm_completions.sse", api="completions")
    assert state.text == "def add(a, b):\n    return a + b"
    assert state.usage["completion_tokens"] == 8
    assert OpenAIWorker._verdict(state) is None


def test_vllm_error_event_is_the_request_error() -> None:
    state = _state("vllm_error.sse")
    assert OpenAIWorker._verdict(state) == (
        "server error event: This model's maximum context length is 4096 tokens."
    )


@pytest.mark.parametrize("step", [None, 1, 5])
def test_trtllm_serve_chat_crlf_keepalive_and_trailing_space(step: int | None) -> None:
    events, parser = _events((SSE / "trtllm_serve_chat.sse").read_bytes(), step)
    assert parser.comments == 9  # eight header lines and one mid-stream keep-alive
    state = StreamState("chat")
    for event in events:
        state.apply(event, 0)
    assert state.text == "The bridge opened in 1932."
    assert state.usage["completion_tokens"] == 12
    assert state.extra == {"avg_decoded_tokens_per_iter": 3.0}
    assert OpenAIWorker._verdict(state) is None


def test_stream_cut_without_done_is_an_error() -> None:
    state = _state("trtllm_serve_cut.sse")
    assert state.text == "partial"
    assert OpenAIWorker._verdict(state) == (
        "stream ended without data: [DONE] after 2 chunk(s): the server closed the response early"
    )


def test_missing_usage_is_an_error() -> None:
    state = StreamState("chat")
    state.apply(SseEvent('{"choices":[{"index":0,"delta":{"content":"x"}}]}'), 1)
    state.apply(SseEvent("[DONE]"), 2)
    assert OpenAIWorker._verdict(state) == (
        "stream carried no usage chunk: the server ignored stream_options.include_usage, so "
        "token counts are unknown"
    )


def test_malformed_data_and_error_event_type() -> None:
    state = StreamState("chat")
    state.apply(SseEvent("{not json"), 1)
    assert state.error == "malformed SSE: event data is not JSON: '{not json'"
    state = StreamState("chat")
    state.apply(SseEvent('{"message": "overloaded"}', event="error"), 1)
    assert state.error == "server error event: overloaded"
    state = StreamState("chat")
    state.apply(SseEvent('{"id": "x"}'), 1)
    assert state.error == "malformed SSE: a chunk has neither choices nor usage"


def test_sse_framing_rules() -> None:
    parser = SseParser()
    # multi-line data joins with \n; "data:x" without a space; CR alone ends a line;
    # an event with no data is dropped; unknown fields are ignored
    events = parser.feed(b"data: a\ndata:b\r\rid: 7\nretry: 5\n\nevent: ping\n\ndata: c")
    assert [(e.event, e.data) for e in events] == [("message", "a\nb")]
    assert parser.feed(b"\n\n") == [SseEvent("c")]
    # a CR at the end of a read may be half of a CRLF
    assert parser.feed(b"data: d\r") == []
    assert parser.feed(b"\n\r\n") == [SseEvent("d")]


def _job(item: dict, top_k: int = 0) -> Job:
    return Job(
        "r",
        0,
        3,
        item,
        item.get("prompt") or "rendered",
        32,
        Arm("x", "m"),
        0.7,
        0.9,
        top_k,
        1237,
        "concurrency=1",
        1,
        None,
        False,
        "rid",
    )


def test_request_body_routes_prompts_and_messages() -> None:
    ep = OpenAIEndpoint("http://127.0.0.1:1", "served")
    path, api, body = request_body(_job({"prompt": "def f():"}), ep)
    assert (path, api) == ("/v1/completions", "completions")
    assert body == {
        "model": "served",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 32,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 1237,
        "prompt": "def f():",
    }
    msgs = [{"role": "user", "content": "hi"}]
    path, api, body = request_body(_job({"messages": msgs}, top_k=5), ep)
    assert (path, api) == ("/v1/chat/completions", "chat")
    assert body["messages"] == msgs and body["top_k"] == 5 and "prompt" not in body


def test_base_url_forms() -> None:
    for url in (
        "http://127.0.0.1:8000",
        "http://127.0.0.1:8000/",
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8000/v1/",
    ):
        assert base_url(url) == "http://127.0.0.1:8000"


# -- Prometheus counters ----------------------------------------------------------------

VLLM_PAGE = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="target"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="target"} 2.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="target"} 1.764e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="target"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="target"} 8.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="target"} 21.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="target"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="target",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="target",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="other"} 999.0
"""
TRTLLM_PAGE = """\
# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{engine_type="undefined",model_name="undefined"} 30.0
trtllm_spec_decode_num_accepted_tokens_total{engine_type="undefined",model_name="undefined"} 12.0
trtllm_spec_decode_accepted_tokens_total{model_name="undefined",token_position="0"} 8.0
trtllm_spec_decode_acceptance_length{engine_type="undefined",model_name="undefined"} 2.2
"""
SGLANG_PAGE = """\
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m"} 2.71
sglang:spec_accept_rate{model_name="m"} 0.43
"""


def test_vllm_counters_summed_per_model_without_decoys() -> None:
    profile, reason = detect(VLLM_PAGE)
    assert profile is not None and profile.runtime == "vllm" and reason is None
    c = counts(VLLM_PAGE, profile, "target")
    assert c == Counts(
        draft_tokens=48.0, accepted_tokens=24.0, drafts=12.0, per_position={0: 12.0, 1: 7.0}
    )


def test_trtllm_counters_have_no_draft_count() -> None:
    profile, _ = detect(TRTLLM_PAGE)
    assert profile is not None and profile.runtime == "trtllm-serve"
    c = counts(TRTLLM_PAGE, profile, "target")  # its model_name label is "undefined"
    assert (c.draft_tokens, c.accepted_tokens, c.drafts, c.per_position) == (
        30.0,
        12.0,
        None,
        {0: 8.0},
    )


def test_gauges_only_and_empty_pages_give_reasons() -> None:
    assert detect(SGLANG_PAGE) == (
        None,
        (
            "SGLang exposes only the gauges sglang:spec_accept_length/spec_accept_rate (a running "
            "average, not counters), so no per-run delta exists"
        ),
    )
    profile, reason = detect("vllm:prompt_tokens_total 5\n")
    assert profile is None and reason.startswith("no speculative-decoding counters")


def test_a_trtllm_serve_without_iteration_stats_is_named_as_such() -> None:
    """trtllm-serve with return_perf_metrics but not enable_iter_perf_stats:
    its per-request metrics and no spec-decode sample (the iteration stats
    collector never ran; tensorrt_llm/serve/openai_server.py at 00057725)."""
    from trtspec.bench.openai_metrics import TRTLLM_NO_ITER_STATS

    page = (
        'trtllm_request_success_total{engine_type="undefined",finished_reason="stop",'
        'model_name="undefined"} 4.0\n'
        'trtllm_e2e_request_latency_seconds_bucket{le="0.3",model_name="undefined"} 4.0\n'
    )
    assert detect(page) == (None, TRTLLM_NO_ITER_STATS)
    assert "enable_iter_perf_stats: true" in TRTLLM_NO_ITER_STATS


def test_parse_prometheus_labels_and_escapes() -> None:
    samples = parse_prometheus('a_total{x="1",y="q\\"z"} 2.5\n# c\nb 3\nbad line\n')
    assert samples == [("a_total", {"x": "1", "y": 'q\\"z'}, 2.5), ("b", {}, 3.0)]


def test_acceptance_fields_from_deltas() -> None:
    before = Counts(10, 4, 3, {0: 3, 1: 1})
    after = Counts(18, 9, 5, {0: 5, 1: 3, 2: 0})
    assert acceptance_fields(after.minus(before)) == {
        "draft_tokens": 8,
        "accepted_tokens": 5,
        "rounds": 2,
        "accepted_per_position": {"0": 2, "1": 2, "2": 0},
        "acceptance_source": "metrics",
        "acceptance_note": None,
    }
    assert acceptance_fields(before.minus(after))["acceptance_note"] == (
        "a counter went backwards (server restarted?)"
    )


def test_attach_cell_acceptance_above_concurrency_one() -> None:
    cell = {
        "arm_kind": "openai",
        "speculative": True,
        "route": "r",
        "variant": "v",
        "load": "concurrency=4",
        "temperature": 0.0,
        "acceptance_source": None,
    }
    fields = acceptance_fields(Counts(40, 30, 10, {}))
    attach_cell_acceptance(
        [cell], [cell_sample("r", "concurrency=4", 0.0, "v", fields), {"route": "r", "bytes": 5}]
    )
    assert cell["acceptance_rate"] == 0.75 and cell["mean_accepted_length"] == 4.0
    assert cell["acceptance_source"] == "metrics"
    other = {
        "arm_kind": "openai",
        "speculative": True,
        "route": "r",
        "variant": "w",
        "load": "concurrency=4",
        "temperature": 0.0,
        "acceptance_source": None,
    }
    attach_cell_acceptance(
        [other],
        [cell_sample("r", "concurrency=4", 0.0, "w", acceptance_fields(None, "no counters"))],
    )
    assert other["acceptance_note"] == "no counters" and "acceptance_rate" not in other
