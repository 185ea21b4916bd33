"""Every ``trtllm-build`` command line the plan writes for the 1.x pins (1.1.0
and 1.2.1) parses with the argparse grammar of ``trtllm-build`` read from the
TensorRT-LLM sources (``tests/data/trtllm_build_flags_1.x.txt``): no unknown
flag, no value outside its choices, no flag given twice. Quantized targets
included, since they change ``--gemm_plugin``."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from trtspec.plan import make_plan
from trtspec.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ROOT / "tests" / "data" / "trtllm_build_flags_1.x.txt"
EXAMPLES = sorted(
    p.stem
    for p in (ROOT / "build_specs").glob("*.yaml")
    if "backend: reference" not in p.read_text(encoding="utf-8")
)


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _Refused(message)


def parser() -> _Parser:
    p = _Parser(prog="trtllm-build", add_help=False, allow_abbrev=False)
    for raw in FLAGS.read_text(encoding="utf-8").splitlines():
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
            p.add_argument(flag, type=str)
    return p


def build_argvs(spec_name: str, version: str, quantization: str | None) -> list[list[str]]:
    source = ROOT / "build_specs" / f"{spec_name}.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data.pop("routes", None)
    data.setdefault("stack", {})["trtllm_version"] = version
    data["stack"].pop("triton_image", None)
    if quantization:
        data["target"]["quantization"] = quantization
        # EAGLE and Medusa-by-converter need an unquantized target; keep the rest.
        data["variants"] = [
            v for v in data.get("variants", []) if v.get("mode") not in ("eagle", "medusa")
        ]
    spec = parse_spec(data, str(source), source_path=source)
    plan = make_plan(spec, Path("/engines"))
    return [list(s.argv) for s in plan.steps if s.argv and s.argv[0] == "trtllm-build"]


@pytest.mark.parametrize("version", ["1.1.0", "1.2.1"])
@pytest.mark.parametrize("spec_name", EXAMPLES)
def test_every_build_argv_parses(spec_name: str, version: str) -> None:
    argvs = build_argvs(spec_name, version, None)
    assert argvs
    for argv in argvs:
        flags = [a for a in argv[1:] if a.startswith("--")]
        assert len(flags) == len(set(flags)), argv
        parser().parse_args(argv[1:])


@pytest.mark.parametrize("quantization", ["fp8", "int8_sq", "int4_awq", "int8_wo", "int4_wo"])
def test_quantized_build_argv_parses(quantization: str) -> None:
    argvs = build_argvs("qwen2.5-7b", "1.2.1", quantization)
    assert argvs
    for argv in argvs:
        parser().parse_args(argv[1:])


def test_the_grammar_refuses_what_trtllm_build_refuses() -> None:
    with pytest.raises(_Refused, match="invalid choice: 'ngram'"):
        parser().parse_args(["--speculative_decoding_mode", "ngram"])
    with pytest.raises(_Refused, match="unrecognized arguments: --tp_size"):
        parser().parse_args(["--tp_size", "2"])  # removed from trtllm-build in 0.12
