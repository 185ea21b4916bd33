"""Prompt-set loading (exact errors), rendering with the real tiny tokenizer,
and the six shipped prompt sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec.bench.routes import RouteSet, load_prompt_set, load_tokenizer, render_prompt
from trtspec.errors import BenchError

ROUTES_DIR = Path(__file__).resolve().parents[2] / "build_specs" / "routes"
SHIPPED = (
    "chat_short",
    "chat_long",
    "code_completion",
    "rag_copy_heavy",
    "rag_reasoning",
    "json_output",
    "json_fill",
)


def _write(tmp_path: Path, *lines: object) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def _error(path: Path) -> BenchError:
    with pytest.raises(BenchError) as exc:
        load_prompt_set(path)
    return exc.value


def test_load_valid_set(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"prompt": "def f():\n", "max_tokens": 8},
        "",
        {"messages": [{"role": "user", "content": "hi"}], "golden": "hello"},
    )
    items = load_prompt_set(path)
    assert [sorted(i) for i in items] == [["max_tokens", "prompt"], ["golden", "messages"]]


@pytest.mark.parametrize(
    ("line", "message", "hint"),
    [
        (
            {"promt": "x"},
            "{p}:1: unknown field 'promt'",
            "did you mean 'prompt'? allowed fields: id, messages, prompt, max_tokens, golden, "
            "golden_threshold, schema, tests",
        ),
        (
            {"prompt": "x", "messages": []},
            "{p}:1: needs exactly one of 'messages' or 'prompt'",
            "see build_specs/routes/README.md for the prompt-set format",
        ),
        (
            {"prompt": "x", "max_tokens": 0},
            "{p}:1: max_tokens: must be a positive integer, got 0",
            "see build_specs/routes/README.md for the prompt-set format",
        ),
        (
            {"messages": [{"role": "bot", "content": "x"}]},
            "{p}:1: messages[0].role: 'bot' is not one of system, user, assistant",
            "see build_specs/routes/README.md for the prompt-set format",
        ),
        (
            {"prompt": "x", "schema": {"type": "strang"}},
            "{p}:1: schema: not a valid JSON Schema ('strang' is not valid under any of the given "
            "schemas)",
            "see build_specs/routes/README.md for the prompt-set format",
        ),
        (
            '{"prompt": "x",',
            "{p}:1: invalid JSON (Expecting property name enclosed in double quotes at column 16)",
            "see build_specs/routes/README.md for the prompt-set format",
        ),
    ],
)
def test_load_errors_are_exact(tmp_path: Path, line: object, message: str, hint: str) -> None:
    path = _write(tmp_path, line)
    err = _error(path)
    assert err.message == message.format(p=path)
    assert err.hint == hint


def test_missing_and_empty_files(tmp_path: Path) -> None:
    err = _error(tmp_path / "nope.jsonl")
    assert err.message == f"{tmp_path / 'nope.jsonl'}: prompt set not found"
    assert err.hint == "check the route's `prompts` path (relative to the spec file)"
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert _error(empty).message == f"{empty}: prompt set is empty"


def test_route_sample_cycles_prompts() -> None:
    rs = RouteSet("r", Path("x"), [{"prompt": "a"}, {"prompt": "b"}], 8)
    assert [(i, it["prompt"]) for i, it in rs.sample(5)] == [
        (0, "a"),
        (1, "b"),
        (2, "a"),
        (3, "b"),
        (4, "a"),
    ]
    assert len(rs.sample(None)) == 2


def test_render_chat_with_the_target_chat_template(tiny_llama: Path) -> None:
    tok = load_tokenizer(tiny_llama)
    item = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    }
    assert render_prompt(item, tok) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_prompt({"prompt": "def f():"}, None) == "def f():"
    with pytest.raises(BenchError) as exc:
        render_prompt(item, None)
    assert exc.value.message == "a chat route needs the target tokenizer to render `messages`"


def test_missing_tokenizer_folder(tmp_path: Path) -> None:
    with pytest.raises(BenchError) as exc:
        load_tokenizer(tmp_path / "tok")
    assert exc.value.message == f"{tmp_path / 'tok'}: tokenizer folder not found"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_prompt_sets(name: str) -> None:
    items = load_prompt_set(ROUTES_DIR / f"{name}.jsonl")
    assert len(items) >= 30
    ids = [it["id"] for it in items]
    assert len(set(ids)) == len(ids)
    texts = [json.dumps(it.get("messages") or it.get("prompt")) for it in items]
    assert len(set(texts)) == len(texts), "prompts must be distinct"
    if name.startswith("rag_"):
        assert all("Passage:\n" in it["messages"][-1]["content"] for it in items)
        assert all(it.get("golden") for it in items)
    if name == "rag_copy_heavy":
        # the golden answer is quoted from the passage inside the prompt
        assert all(it["golden"] in it["messages"][-1]["content"] for it in items)
    if name in ("json_output", "json_fill"):
        assert all(isinstance(it.get("schema"), dict) for it in items)
    if name == "json_fill":
        # the template in the prompt has exactly the schema's keys
        for it in items:
            template = json.loads(it["messages"][-1]["content"].rsplit("JSON: ", 1)[1])
            assert sorted(template) == sorted(it["schema"]["required"])
    if name == "code_completion":
        assert all("prompt" in it for it in items)
    if name.startswith("chat_"):
        assert all("messages" in it for it in items)
