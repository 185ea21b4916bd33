"""`trtspec bench` argument and input errors: exit codes, exact stderr, empty
stdout, and nothing written to the run folder."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from trtspec.cli.main import cli


def _spec(tmp_path: Path) -> Path:
    (tmp_path / "chat.jsonl").write_text(
        json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n"
    )
    spec = tmp_path / "s.yaml"
    spec.write_text("""\
name: s
backend: reference
target: {model: example-org/tiny, family: llama}
variants:
  - {name: ngram, mode: ngram, max_draft_len: 4}
routes:
  chat: {prompts: chat.jsonl, max_tokens: 8}
""")
    return spec


def _bench(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, ["bench", *args])
    return res.exit_code, res.stdout, res.stderr


def test_chat_route_without_tokenizer(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code, out, err = _bench(
        str(_spec(tmp_path)),
        "--endpoint",
        "127.0.0.1:1",
        "--run-dir",
        str(run),
        "--engines",
        str(tmp_path / "engines"),
    )
    assert code == 1
    assert out == ""
    tok = tmp_path / "engines" / "s" / "target" / "tokenizer"
    assert err == (
        f"Error: {tok}: tokenizer folder not found\n"
        "Hint: build the engines first (`trtspec build SPEC`) or pass --tokenizer "
        "pointing at a Hugging Face tokenizer folder\n"
    )
    assert not run.exists()


def test_run_folder_already_used(tmp_path: Path, tiny_llama: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "requests.jsonl").write_text("")
    code, out, err = _bench(
        str(_spec(tmp_path)),
        "--endpoint",
        "127.0.0.1:1",
        "--run-dir",
        str(run),
        "--tokenizer",
        str(tiny_llama),
    )
    assert (code, out) == (1, "")
    assert err == (
        f"Error: {run}: already holds a run (requests.jsonl exists)\n"
        "Hint: choose a new --run-dir, or delete the old run first\n"
    )


def test_isolate_conflicts_with_endpoint(tmp_path: Path, tiny_llama: Path) -> None:
    code, _, err = _bench(
        str(_spec(tmp_path)),
        "--endpoint",
        "127.0.0.1:1",
        "--isolate",
        "--run-dir",
        str(tmp_path / "run"),
        "--tokenizer",
        str(tiny_llama),
    )
    assert code == 1
    assert err.startswith(
        "Error: --isolate starts one server per variant and cannot use --endpoint\n"
    )
    assert not (tmp_path / "run").exists()


def test_unknown_variant_and_bad_lists(tmp_path: Path) -> None:
    spec = str(_spec(tmp_path))
    code, _, err = _bench(spec, "--variants", "eagle", "--run-dir", str(tmp_path / "r"))
    assert code == 1
    assert err == (
        "Error: --variants: unknown variant 'eagle'\nHint: variants in the spec: ngram\n"
    )
    code, _, err = _bench(spec, "--concurrency", "1,x")
    assert code == 2
    assert "Invalid value for '--concurrency': 'x' is not a positive integer" in err
    for bad in ("3", "nan", "inf", "-0.5"):
        code, _, err = _bench(spec, "--temperatures", f"0,{bad}")
        assert code == 2, bad
        assert f"Invalid value for '--temperatures': '{bad}' is not a temperature in [0, 2]" in err


def test_missing_spec_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    code, out, err = _bench(str(tmp_path / "nope.yaml"))
    assert (code, out) == (1, "")
    assert err.startswith("Error: ")
    assert "nope.yaml" in err
    assert "Traceback" not in err
