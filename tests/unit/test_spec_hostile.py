# ruff: noqa: E501  (exact user-facing messages read best on one line)
"""Hostile spec text ends in a clear error naming file, line and field — the
cases benchmarks/fuzz_specs.py found ending in "unexpected … report it"
(issue 28): control characters, 100 kB strings and paths, invalid UTF-8, and
values of the wrong type that lax validation used to coerce."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.errors import SpecError
from trtspec.spec import load_spec

BASE = """\
name: t
target:
  model: org/target
  family: llama
variants:
  - name: ngram
    mode: ngram
    max_draft_len: 4
"""


def issues_of(path: Path) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_spec(path)
    return err.value.issues


def test_nul_in_a_value_names_the_field(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(BASE.replace("model: org/target", 'model: "org/\\0target"'))
    assert issues_of(p) == [
        f"{p}:3:10: target.model: the value contains the control character U+0000; remove it"
    ]


def test_raw_control_byte_in_the_file_is_placed(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes(BASE.replace("family: llama", "family: ll\x1bama").encode())
    with pytest.raises(SpecError) as err:
        load_spec(p)
    assert err.value.issues == [
        f"{p}:4:13: invalid YAML: control character U+001B is not allowed in a spec"
    ]
    assert err.value.hint.startswith("remove the character")


def test_control_character_in_a_key(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(BASE + '"rout\\x01es": {}\n')
    assert issues_of(p) == [
        f"{p}:9:1: rout\x01es: the key contains the control character U+0001; remove it"
    ]


def test_100_kb_path_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(BASE.replace("org/target", "/" + "a" * 100_000))
    assert issues_of(p) == [
        f"{p}:3:10: target.model: the value is 100,001 characters long; at most 4,096 are allowed"
    ]


def test_non_utf8_error_carries_line_and_column(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes(BASE.encode().replace(b"family: llama", b"family: ll\xffama"))
    assert issues_of(p) == [f"{p}:4:13: not UTF-8 text (byte 0xFF: invalid start byte)"]


def test_spec_file_name_too_long(tmp_path: Path) -> None:
    name = str(tmp_path / ("x" * 5000 + ".yaml"))
    with pytest.raises(SpecError) as err:
        load_spec(name)
    assert err.value.issues[0].endswith(
        "…: the file name is too long (5,000 characters)".replace("5,000", f"{len(name):,}")
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("true", "expected an integer, got True (a boolean)"),
        ("'12'", "expected an integer, got '12' (a string); remove the quotes"),
        ("12.0", "expected an integer, got 12.0 (a number)"),
        ("[1]", "expected an integer, got [1] (a list)"),
    ],
)
def test_types_are_strict(tmp_path: Path, value: str, message: str) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(BASE.replace("  family: llama\n", f"  family: llama\n  max_input_len: {value}\n"))
    assert issues_of(p) == [f"{p}:5:18: target.max_input_len: {message}"]


def test_strict_types_keep_enums_numbers_and_bools_working(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        BASE.replace(
            "  family: llama\n",
            "  family: llama\n  dtype: float32\n  quantization: int8\n"
            "  kv_cache: {free_gpu_mem_fraction: 1, enable_reuse: false}\n",
        )
        + "backend: reference\n"
    )
    spec = load_spec(p)
    assert spec.target.kv_cache.free_gpu_mem_fraction == 1.0
    assert spec.target.kv_cache.enable_reuse is False
    assert spec.backend.value == "reference" and spec.target.dtype.value == "float32"


def test_bool_field_refuses_a_string(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(
        BASE.replace("  family: llama\n", "  family: llama\n  kv_cache: {enable_reuse: 'yes'}\n")
    )
    assert issues_of(p) == [
        f"{p}:5:28: target.kv_cache.enable_reuse: expected true or false, got 'yes' (a string); remove the quotes"
    ]


def test_cli_says_error_not_unexpected(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_bytes(BASE.encode().replace(b"org/target", b"org/\x00target"))
    result = CliRunner().invoke(cli, ["validate", str(p)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {p}:3:14: invalid YAML: control character U+0000")
    assert "unexpected" not in result.output and "Traceback" not in result.output
