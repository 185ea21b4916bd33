"""Every ``convert_checkpoint.py`` (Llama family) and ``quantize.py`` command
line the plan writes for the 1.x pins parses with the argparse grammar read
from the TensorRT-LLM sources (tests/data/trtllm_convert_llama_flags_1.x.txt,
tests/data/trtllm_quantize_flags_1.x.txt; each header names the commit): no
unknown flag, no value outside its choices, no flag twice — the quantized
targets included. The Qwen, Medusa and EAGLE converters are not covered here:
their grammars were not read."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from trtspec.plan import make_plan
from trtspec.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
CONVERT = DATA / "trtllm_convert_llama_flags_1.x.txt"
QUANTIZE = DATA / "trtllm_quantize_flags_1.x.txt"
LLAMA_SPECS = ["vicuna-7b", "small-medusa", "small-eagle"]
QUANTIZED = ["fp8", "int8_sq", "int4_awq", "int8_wo", "int4_wo"]


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def grammar(path: Path) -> _Parser:
    p = _Parser(prog=path.name, add_help=False, allow_abbrev=False)
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        flag, kind, *choices = line.split()
        if kind == "flag":
            p.add_argument(flag, action="store_true")
        elif kind == "int":
            p.add_argument(flag, type=int)
        elif kind == "choice":
            p.add_argument(flag, choices=choices)
        else:
            assert kind == "str", line
            p.add_argument(flag, type=str)
    return p


def script_argvs(spec_name: str, version: str, quantization: str | None) -> list[list[str]]:
    source = ROOT / "build_specs" / f"{spec_name}.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data.pop("routes", None)
    data.setdefault("stack", {})["trtllm_version"] = version
    data["stack"].pop("triton_image", None)
    if quantization:
        data["target"]["quantization"] = quantization
        data["variants"] = [
            v for v in data.get("variants", []) if v.get("mode") not in ("eagle", "medusa")
        ]
    spec = parse_spec(data, str(source), source_path=source)
    plan = make_plan(spec, Path("/engines"), examples_dir="/app/examples")
    return [list(s.argv) for s in plan.steps if s.kind in ("convert", "quantize")]


def check(argv: list[str]) -> None:
    assert argv[0] == "python", argv
    script = argv[1]
    if script == "/app/examples/quantization/quantize.py":
        parser = grammar(QUANTIZE)
    elif script == "/app/examples/models/core/llama/convert_checkpoint.py":
        parser = grammar(CONVERT)
    else:
        return  # Medusa/EAGLE converters: grammar not read (module docstring)
    flags = [a for a in argv[2:] if a.startswith("--")]
    assert len(flags) == len(set(flags)), argv
    parser.parse_args(argv[2:])


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
@pytest.mark.parametrize("spec_name", LLAMA_SPECS)
def test_llama_convert_argv_parses(spec_name: str, version: str) -> None:
    argvs = script_argvs(spec_name, version, None)
    scripts = {a[1] for a in argvs}
    assert "/app/examples/models/core/llama/convert_checkpoint.py" in scripts, scripts
    for argv in argvs:
        check(argv)


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
@pytest.mark.parametrize("quantization", QUANTIZED)
def test_quantize_argv_parses(quantization: str, version: str) -> None:
    argvs = script_argvs("vicuna-7b", version, quantization)
    quantize = [a for a in argvs if a[1].endswith("/quantization/quantize.py")]
    assert quantize, argvs
    for argv in argvs:
        check(argv)
    assert quantize[0][quantize[0].index("--qformat") + 1] == quantization


def test_the_grammar_refuses_what_upstream_refuses() -> None:
    """The check can fail: a flag upstream lacks, a value outside its
    choices and a missing value are each refused."""
    convert, quantize = grammar(CONVERT), grammar(QUANTIZE)
    for parser, argv in (
        (convert, ["--model_dir", "m", "--max_draft_len", "4"]),
        (convert, ["--dtype", "fp16"]),
        (quantize, ["--qformat", "int8"]),
        (quantize, ["--tp_size"]),
    ):
        with pytest.raises(_Refused):
            parser.parse_args(argv)


def test_headers_name_the_source_commit() -> None:
    for path in (CONVERT, QUANTIZE):
        head = path.read_text(encoding="utf-8").split("\n--", 1)[0]
        assert "NVIDIA/TensorRT-LLM" in head and "at commit " in head, path
        assert "Release: " in head, path
