"""`trtspec routes import`: Spec-Bench / MT-Bench, ShareGPT and OpenAI-messages
corpora become one validated prompt set per category, sampled with a seed,
with line/field/fix errors for malformed records.

tests/data/corpora/spec_bench_question_sample.jsonl is the first two records
of each of the 13 categories of Spec-Bench's data/spec_bench/question.jsonl
(github.com/hemingkx/Spec-Bench, commit fd2c1cd7d2201ef71db4c5f4e455008f017967bf,
Apache-2.0), unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.bench.corpus import group_routes, import_corpus, read_corpus
from trtspec.bench.routes import load_prompt_set, render_prompt
from trtspec.cli.main import cli
from trtspec.errors import BenchError
from trtspec.spec.schema import Route

SPEC_BENCH = Path(__file__).parents[1] / "data" / "corpora" / "spec_bench_question_sample.jsonl"
CATEGORIES = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
]


def _jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_spec_bench_one_route_per_category(tmp_path: Path) -> None:
    result = import_corpus(SPEC_BENCH, tmp_path / "routes")
    assert result.format == "spec_bench"
    assert [r.name for r in result.routes] == CATEGORIES
    for route in result.routes:
        items = load_prompt_set(route.path)  # the bench's own validator accepts them
        assert len(items) == 2
        assert [i["id"] for i in items] == [i["id"] for i in route.items]
    by_name = {r.name: r for r in result.routes}
    # reasoning 101 has reference answers: turn 2 follows turn 1's reference
    first = json.loads(SPEC_BENCH.read_text().splitlines()[4])
    assert first["question_id"] == 101
    assert by_name["reasoning"].items[0]["messages"] == [
        {"role": "user", "content": first["turns"][0]},
        {"role": "assistant", "content": first["reference"][0]},
        {"role": "user", "content": first["turns"][1]},
    ]
    # writing has no reference answers: cut to the first turn, and counted
    assert by_name["writing"].cut == 2
    assert all(len(i["messages"]) == 1 for i in by_name["writing"].items)
    # extraction: one record with references, one without
    assert by_name["extraction"].cut == 1
    assert [len(i["messages"]) for i in by_name["extraction"].items] == [3, 1]
    assert by_name["coding"].checks == ["python_compile"]
    assert by_name["writing"].max_tokens == 384


def test_routes_yaml_is_a_valid_routes_block(tmp_path: Path) -> None:
    result = import_corpus(SPEC_BENCH, tmp_path / "imported", only=["coding", "qa"])
    assert result.routes_yaml == tmp_path / "imported" / "routes.yaml"
    block = yaml.safe_load(result.routes_yaml.read_text())["routes"]
    assert block == {
        "coding": {
            "prompts": "imported/coding.jsonl",
            "max_tokens": 384,
            "checks": ["python_compile"],
        },
        "qa": {"prompts": "imported/qa.jsonl", "max_tokens": 128},
    }
    for entry in block.values():
        Route.model_validate(entry)
        assert (tmp_path / entry["prompts"]).is_file()
    # a spec elsewhere: paths relative to its folder
    spec_dir = tmp_path / "specs"
    out = tmp_path / "specs" / "routes" / "sb"
    import_corpus(SPEC_BENCH, out, only=["qa"], spec_dir=spec_dir)
    block = yaml.safe_load((out / "routes.yaml").read_text())["routes"]
    assert block["qa"]["prompts"] == "routes/sb/qa.jsonl"
    assert (spec_dir / block["qa"]["prompts"]).is_file()


def test_turns_first_keeps_only_the_first_user_turn(tmp_path: Path) -> None:
    _, records = read_corpus(SPEC_BENCH, turns="first")
    assert all(len(r.messages) == 1 and r.messages[0]["role"] == "user" for r in records)


def test_sampling_is_seeded_and_keeps_file_order(tmp_path: Path) -> None:
    rows = [
        {"question_id": i, "category": "qa" if i % 2 else "rag", "turns": [f"q{i}"]}
        for i in range(40)
    ]
    path = _jsonl(tmp_path / "q.jsonl", rows)
    _, records = read_corpus(path)
    a = group_routes(records, per_category=5, seed=7)
    b = group_routes(records, per_category=5, seed=7)
    c = group_routes(records, per_category=5, seed=8)
    ids = [[i["id"] for i in r.items] for r in a]
    assert ids == [[i["id"] for i in r.items] for r in b]
    assert ids != [[i["id"] for i in r.items] for r in c]
    for route in a:
        assert len(route.items) == 5 and route.available == 20
        numbers = [int(i["id"].split("-")[1]) for i in route.items]
        assert numbers == sorted(numbers)


def test_mapping_merges_categories(tmp_path: Path) -> None:
    _, records = read_corpus(SPEC_BENCH)
    routes = group_routes(
        records,
        mapping={"math": "maths", "math_reasoning": "maths"},
        only=["math", "math_reasoning"],
    )
    assert [(r.name, r.categories, len(r.items)) for r in routes] == [
        ("maths", ["math", "math_reasoning"], 4)
    ]
    with pytest.raises(BenchError) as err:
        group_routes(records, mapping={"poetry": "p"})
    assert err.value.message == "--map: no records of category 'poetry'"


def test_sharegpt(tmp_path: Path) -> None:
    path = _jsonl(
        tmp_path / "sg.jsonl",
        [
            {
                "id": "a1",
                "conversations": [
                    {"from": "system", "value": "Be brief."},
                    {"from": "human", "value": "hi"},
                    {"from": "gpt", "value": "hello"},
                    {"from": "human", "value": "and?"},
                    {"from": "gpt", "value": "recorded answer"},
                ],
            }
        ],
    )
    result = import_corpus(path, tmp_path / "out", default_category="Production Chat")
    assert result.format == "sharegpt"
    (route,) = result.routes
    assert route.name == "production_chat"
    assert route.items == [
        {
            "id": "production_chat-a1",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "and?"},
            ],
        }
    ]


def test_openai_messages_render_through_the_chat_template(tmp_path: Path, tiny_llama: Path) -> None:
    from transformers import AutoTokenizer

    path = _jsonl(
        tmp_path / "oa.jsonl",
        [
            {
                "metadata": {"category": "support"},
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "reset my "},
                            {"type": "text", "text": "password"},
                        ],
                    },
                    {"role": "assistant", "content": "done"},
                ],
            }
        ],
    )
    result = import_corpus(path, tmp_path / "out")
    (item,) = load_prompt_set(result.routes[0].path)
    assert result.routes[0].name == "support"
    assert item["messages"] == [{"role": "user", "content": "reset my password"}]
    text = render_prompt(item, AutoTokenizer.from_pretrained(str(tiny_llama)))
    assert "reset my password" in text and "done" not in text


@pytest.mark.parametrize(
    ("rows", "fmt", "message"),
    [
        (
            ["{not json"],
            "auto",
            ":1: invalid JSON (Expecting property name enclosed in double quotes at column 2)",
        ),
        (
            [{"foo": 1}],
            "auto",
            ":1: cannot tell the corpus format: the record has none of "
            "'turns', 'conversations', 'messages'",
        ),
        ([{"turns": "q"}], "auto", ":1: turns: must be a non-empty list of the user's messages"),
        ([{"turns": ["a"]}, {"turns": [3]}], "auto", ":2: turns[0]: must be a string"),
        ([{"turns": ["a"], "category": ""}], "auto", ":1: category: must be a non-empty string"),
        (
            [{"conversations": [{"from": "tool", "value": "x"}]}],
            "auto",
            ":1: conversations[0].from: 'tool' is not one of "
            "assistant, chatgpt, gpt, human, system, user",
        ),
        (
            [{"conversations": [{"from": "gpt", "value": "x"}]}],
            "auto",
            ":1: conversations: has no user turn to answer",
        ),
        (
            [{"messages": [{"role": "user"}]}],
            "auto",
            ":1: messages[0]: must be an object with 'role' and 'content'",
        ),
        (
            [{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}],
            "auto",
            ":1: messages[0].content[0]: only text parts can be imported, got type 'image_url'",
        ),
        (
            [{"messages": []}],
            "openai",
            ":1: messages: must be a non-empty list of {'role', 'content'}",
        ),
        ([[1, 2]], "auto", ":1: expected a JSON object, got list"),
    ],
)
def test_malformed_records_name_line_and_field(
    tmp_path: Path, rows: list[object], fmt: str, message: str
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    with pytest.raises(BenchError) as err:
        read_corpus(path, fmt)
    assert err.value.message == f"{path}{message}"
    assert err.value.hint


def test_non_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"turns": ["ok"]}\n{"turns": ["caf\xe9"]}\n')
    with pytest.raises(BenchError) as err:
        read_corpus(path)
    assert err.value.message == f"{path}:2: not UTF-8 text"


def test_cli_import_table_json_and_no_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "routes"
    args = ["routes", "import", str(SPEC_BENCH), "--out", str(out), "--only", "qa,rag"]
    res = CliRunner().invoke(cli, [*args, "--per-category", "1", "--seed", "3"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["route", "prompts", "of", "cut", "max_tokens", "checks", "file"]
    assert [line.split()[:6] for line in lines[2:]] == [
        ["qa", "1", "2", "0", "128", "-"],
        ["rag", "1", "2", "0", "128", "-"],
    ]
    assert "as spec_bench" in res.stderr

    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1
    assert res.stderr.startswith(f"Error: {out / 'qa.jsonl'}: already exists (and 2 more)\n")
    assert "--force" in res.stderr

    res = CliRunner().invoke(cli, [*args, "--force", "--format", "json", "--map", "qa=questions"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert [r["route"] for r in data["routes"]] == ["questions", "rag"]
    assert data["routes"][0]["prompts"] == 2

    res = CliRunner().invoke(cli, [*args, "--map", "qa"])
    assert res.exit_code == 1
    assert "Error: --map 'qa': expected CATEGORY=ROUTE" in res.stderr


def test_the_shipped_specbench_spec_and_its_imported_routes(tmp_path: Path) -> None:
    """build_specs/specbench-cpu.yaml validates as shipped (a folder stands in
    for the demo model `make demo` fetches) and its prompt sets are what the
    import wrote: 8 Spec-Bench questions per category, valid for the bench."""
    import shutil

    from trtspec.spec import load_spec

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "build_specs", tmp_path / "build_specs")
    model = tmp_path / ".cache" / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    spec = load_spec(tmp_path / "build_specs" / "specbench-cpu.yaml")
    assert list(spec.routes) == ["summarization", "rag", "translation"]
    assert spec.bench.decision.objectives is not None
    for route in spec.routes.values():
        items = load_prompt_set(spec.resolve_path(route.prompts))
        assert len(items) == 8
        assert all(i["id"].startswith(route.prompts.split("/")[-1][:-6]) for i in items)
