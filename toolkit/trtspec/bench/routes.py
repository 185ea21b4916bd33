"""Route prompt sets: loading and validating ``build_specs/routes/*.jsonl``
(one JSON object per line: chat ``messages`` or a plain ``prompt``, optional
``id``, ``max_tokens``, ``golden``, ``golden_threshold``, ``schema``, ``tests``
— pytest source, or a ``.py`` file relative to the prompt set), and
rendering each item to the ``text_input`` string the orchestrator receives
(chat items through the target tokenizer's chat template, client-side, so
every variant sees byte-identical text). Errors name the file, the line, the
field and the fix."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, cast

from trtspec.errors import BenchError


class Message(TypedDict):
    role: str  # one of ROLES
    content: str


class PromptItem(TypedDict, total=False):
    """One line of a prompt set, as ``_validate_item`` accepts it: exactly
    one of ``messages`` or ``prompt``; the rest optional."""

    id: Any
    messages: list[Message]
    prompt: str
    max_tokens: int
    golden: str
    golden_threshold: float
    schema: dict[str, Any]  # a JSON Schema
    tests: str  # pytest source (a named .py file is read at load)


ITEM_KEYS = tuple(PromptItem.__annotations__)
ROLES = ("system", "user", "assistant")
_FORMAT_HINT = "see build_specs/routes/README.md for the prompt-set format"


@dataclass
class RouteSet:
    """One route's prompts and the settings the benchmark applies to it."""

    name: str
    path: Path
    items: list[PromptItem]
    max_tokens: int
    checks: list[str] = field(default_factory=list)
    requests: int | None = None
    # closed-loop levels for this route; None = the run's (BenchSettings.concurrency)
    concurrency: list[int] | None = None
    # sampling temperatures for this route; None = the run's (BenchSettings.temperatures)
    temperatures: list[float] | None = None

    def sample(self, n: int | None) -> list[tuple[int, PromptItem]]:
        """``n`` (sample_index → item) pairs, cycling through the prompts
        in file order when ``n`` exceeds their number."""
        count = len(self.items) if n is None else n
        return [(i, self.items[i % len(self.items)]) for i in range(count)]


def _fail(path: Path, line: int, msg: str, hint: str = _FORMAT_HINT) -> BenchError:
    return BenchError(f"{path}:{line}: {msg}", hint=hint)


def _validate_item(path: Path, line: int, item: Any) -> PromptItem:
    if not isinstance(item, dict):
        raise _fail(path, line, f"expected a JSON object, got {type(item).__name__}")
    for key in item:
        if key not in ITEM_KEYS:
            close = difflib.get_close_matches(key, ITEM_KEYS, n=1)
            raise _fail(
                path,
                line,
                f"unknown field {key!r}",
                hint=(f"did you mean {close[0]!r}? " if close else "")
                + "allowed fields: "
                + ", ".join(ITEM_KEYS),
            )
    has_messages, has_prompt = "messages" in item, "prompt" in item
    if has_messages == has_prompt:
        raise _fail(path, line, "needs exactly one of 'messages' or 'prompt'")
    if has_prompt and (not isinstance(item["prompt"], str) or not item["prompt"]):
        raise _fail(path, line, "prompt: must be a non-empty string")
    if has_messages:
        msgs = item["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise _fail(path, line, "messages: must be a non-empty list of {role, content}")
        for i, m in enumerate(msgs):
            if (
                not isinstance(m, dict)
                or set(m) != {"role", "content"}
                or not isinstance(m["content"], str)
            ):
                raise _fail(
                    path,
                    line,
                    f'messages[{i}]: must be {{"role": ..., "content": "..."}} and nothing else',
                )
            if m["role"] not in ROLES:
                raise _fail(
                    path,
                    line,
                    f"messages[{i}].role: {m['role']!r} is not one of " + ", ".join(ROLES),
                )
    mt = item.get("max_tokens")
    if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt < 1):
        raise _fail(path, line, f"max_tokens: must be a positive integer, got {mt!r}")
    if "golden" in item and not isinstance(item["golden"], str):
        raise _fail(path, line, "golden: must be a string")
    gt = item.get("golden_threshold")
    if gt is not None and (not isinstance(gt, int | float) or not 0 <= gt <= 1):
        raise _fail(path, line, f"golden_threshold: must be a number in [0, 1], got {gt!r}")
    if "tests" in item:
        item["tests"] = _tests_source(path, line, item["tests"])
    if "schema" in item:
        import jsonschema

        if not isinstance(item["schema"], dict):
            raise _fail(path, line, "schema: must be a JSON Schema object")
        try:
            jsonschema.validators.validator_for(item["schema"]).check_schema(item["schema"])
        except jsonschema.SchemaError as exc:
            raise _fail(path, line, f"schema: not a valid JSON Schema ({exc.message})") from None
    return cast(PromptItem, item)


def _tests_source(path: Path, line: int, tests: Any) -> str:
    """A prompt's pytest tests: inline source, or a ``.py`` file named
    relative to the prompt set (read now, so the run records what it ran)."""
    if not isinstance(tests, str) or not tests.strip():
        raise _fail(path, line, "tests: must be pytest source or a path to a .py file")
    if "\n" in tests or not tests.strip().endswith(".py"):
        return tests
    file = (path.parent / tests.strip()).resolve()
    try:
        return file.read_text(encoding="utf-8")
    except OSError as exc:
        raise _fail(
            path,
            line,
            f"tests: cannot read {file}: {exc.strerror}",
            hint="name a test file relative to the prompt set, or inline the tests",
        ) from None


def load_prompt_set(path: Path) -> list[PromptItem]:
    """Read and validate one prompt set."""
    if not path.is_file():
        raise BenchError(
            f"{path}: prompt set not found",
            hint="check the route's `prompts` path (relative to the spec file)",
        )
    items = []
    for n, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise _fail(path, n, f"invalid JSON ({exc.msg} at column {exc.colno})") from None
        items.append(_validate_item(path, n, item))
    if not items:
        raise BenchError(f"{path}: prompt set is empty", hint=_FORMAT_HINT)
    return items


def render_prompt(item: PromptItem, tokenizer: Any | None) -> str:
    """The exact ``text_input`` for an item."""
    if item.get("prompt") is not None:
        return str(item["prompt"])
    if tokenizer is None:
        raise BenchError(
            "a chat route needs the target tokenizer to render `messages`",
            hint="pass --tokenizer DIR or build the engines first "
            "(engines/<spec>/target/tokenizer/)",
        )
    text = tokenizer.apply_chat_template(
        item["messages"], tokenize=False, add_generation_prompt=True
    )
    return str(text)


def load_tokenizer(path: Path | None) -> Any | None:
    if path is None:
        return None
    if not path.is_dir():
        raise BenchError(
            f"{path}: tokenizer folder not found",
            hint="build the engines first (`trtspec build SPEC`) or pass "
            "--tokenizer pointing at a Hugging Face tokenizer folder",
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
