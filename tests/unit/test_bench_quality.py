"""Quality checks: real py_compile and ruff subprocesses, jsonschema, golden."""

from __future__ import annotations

import pytest

from trtspec.bench import quality
from trtspec.bench.quality import (
    QualityRunner,
    check_golden,
    check_json_schema,
    check_python_compile,
    check_ruff,
    extract_code,
    extract_json,
    quality_passed,
)
from trtspec.errors import BenchError

COMPLETION_ITEM = {"prompt": 'def add(a, b):\n    """Add."""\n'}
CHAT_ITEM = {"messages": [{"role": "user", "content": "write code"}]}


def test_extract_code_prefers_fenced_block_then_prompt_plus_completion() -> None:
    text = "Here:\n```python\nx = 1\n```\nDone."
    assert extract_code(text, CHAT_ITEM) == "x = 1\n"
    assert extract_code("    return a + b\n", COMPLETION_ITEM) == (
        COMPLETION_ITEM["prompt"] + "    return a + b\n"
    )
    assert extract_code("plain", CHAT_ITEM) == "plain"


def test_extract_code_of_a_completion_stops_at_a_fence_and_drops_a_cut_line() -> None:
    prompt = COMPLETION_ITEM["prompt"]
    closed = "    return a + b\n```\n\nThis adds two numbers."
    assert extract_code(closed, COMPLETION_ITEM) == prompt + "    return a + b\n"
    cut = "    total = a + b\n    return tot"
    assert extract_code(cut, COMPLETION_ITEM) == prompt + "    total = a + b\n"
    assert check_python_compile(closed, COMPLETION_ITEM).status == "pass"


def test_python_compile_pass_and_fail() -> None:
    ok = check_python_compile("    return a + b\n", COMPLETION_ITEM)
    assert ok.status == "pass"
    bad = check_python_compile("    return a +\n", COMPLETION_ITEM)
    assert bad.status == "fail"
    assert "SyntaxError" in bad.detail or "invalid syntax" in bad.detail


def test_ruff_pass_fail_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_ruff("    return a + b\n", COMPLETION_ITEM).status == "pass"
    res = check_ruff("    return a + undefined_name\n", COMPLETION_ITEM)
    assert res.status == "fail"
    assert "F821" in res.detail
    monkeypatch.setattr(quality, "find_ruff", lambda: None)
    skipped = check_ruff("    return a + b\n", COMPLETION_ITEM)
    assert (skipped.status, skipped.detail) == ("skipped", "skipped: ruff not installed")


def test_json_schema_checks() -> None:
    item = {
        "messages": [],
        "schema": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
            "additionalProperties": False,
        },
    }
    assert check_json_schema('{"a": 3}', item).status == "pass"
    assert check_json_schema('Sure! ```json\n{"a": 3}\n```', item).status == "pass"
    wrong = check_json_schema('{"a": "x"}', item)
    assert (wrong.status, wrong.detail) == ("fail", "schema: a: 'x' is not of type 'integer'")
    missing = check_json_schema("{}", item)
    assert missing.detail == "schema: <root>: 'a' is a required property"
    assert check_json_schema("{oops", item).detail.startswith("not JSON: ")
    assert check_json_schema("{}", {"messages": []}).status == "skipped"
    assert extract_json('noise {"b": [1, 2]} tail') == '{"b": [1, 2]}'


def test_golden_found_inside_a_longer_answer_passes() -> None:
    item = {"prompt": "q", "golden": "It was completed in 1987."}
    quoted = (
        "The passage describes the bridge. It mentions that Harlow Footbridge was "
        "completed in 1987, a milestone."
    )
    result = check_golden(quoted, item)
    assert result.status == "pass", result.detail
    unrelated = "The bridge is long and made of larch wood, linking the mill to the station."
    assert check_golden(unrelated, item).status == "fail"


def test_golden_similarity_threshold() -> None:
    item = {"prompt": "q", "golden": "It was completed in 1987."}
    assert check_golden("It was completed in 1987.", item).detail == (
        "similarity 1.00 (threshold 0.60)"
    )
    assert check_golden("Bananas are yellow fruit.", item).status == "fail"
    loose = {**item, "golden_threshold": 0.1}
    assert check_golden("completed", loose).status == "pass"
    assert check_golden("x", {"prompt": "q"}).status == "skipped"


def test_runner_caches_and_combines() -> None:
    calls = []

    def counting(text: str, item: dict) -> quality.CheckResult:
        calls.append(text)
        return quality.CheckResult("pass", "ok")

    quality.register_check("counting_test", counting)
    try:
        runner = QualityRunner()
        r1 = runner.run(["counting_test"], "same", {"prompt": "p"}, 0)
        r2 = runner.run(["counting_test"], "same", {"prompt": "p"}, 0)
        assert r1 == r2 == {"counting_test": {"status": "pass", "detail": "ok"}}
        assert calls == ["same"]
    finally:
        del quality.CHECKS["counting_test"]


def test_quality_passed_semantics() -> None:
    assert quality_passed({}) is None
    assert quality_passed({"a": {"status": "skipped"}}) is None
    assert quality_passed({"a": {"status": "pass"}, "b": {"status": "skipped"}}) is True
    assert quality_passed({"a": {"status": "pass"}, "b": {"status": "fail"}}) is False


def test_unknown_check_name_is_exact() -> None:
    with pytest.raises(BenchError) as exc:
        quality.validate_check_names(["json_shema"], "routes.json_output.checks")
    assert exc.value.message == "routes.json_output.checks: unknown quality check 'json_shema'"
    assert exc.value.hint == (
        "did you mean 'json_schema'? known checks: golden, json_schema, "
        "pytest, python_compile, ruff"
    )
