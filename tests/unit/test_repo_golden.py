"""Golden trees for the example GPU specs (``tensorrt_llm`` backend, every
mode between them) and the structural check that every tensor name we give
the ``tensorrtllm`` backend exists in that version's official template.

Refresh the golden files with ``TRTSPEC_UPDATE_GOLDEN=1 pytest
tests/unit/test_repo_golden.py``: the run writes them and fails; review
the diff, then run again without the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from google.protobuf import text_format
from tests.fixtures.golden import check_golden_tree
from tritonclient.grpc import model_config_pb2

from trtspec.plan import make_plan
from trtspec.repo.assemble import assemble
from trtspec.runtime.contract import (
    KV_REUSE_OUTPUTS,
    LOOKAHEAD_INPUTS,
    PERF_OUTPUTS,
    engine_contract,
)
from trtspec.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "repo"
DATA = ROOT / "tests" / "data"
GPU_SPECS = ["qwen2.5-7b", "vicuna-7b"]
# Inside the Triton TRT-LLM container the engines are mounted here.
ENGINES = Path("/engines")


def template_names(version_file: str) -> tuple[set[str], set[str]]:
    inputs, outputs = set(), set()
    for line in (DATA / version_file).read_text(encoding="utf-8").splitlines():
        if not line or line.startswith("#"):
            continue
        kind, name = line.split()
        (inputs if kind == "input" else outputs).add(name)
    return inputs, outputs


def generate(spec_name: str, output: Path) -> Path:
    source = ROOT / "build_specs" / f"{spec_name}.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    # Routes only feed the benchmark; dropping them keeps this test independent
    # of the prompt files.
    data.pop("routes", None)
    spec = parse_spec(data, str(source), source_path=source)
    plan = make_plan(spec, ENGINES)
    return assemble(spec, plan, ENGINES, output, require_engines=False)


def normalized(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.name == "trtspec-repo.json":
        data = json.loads(text)
        data["spec_hash"] = "<spec hash>"
        text = json.dumps(data, indent=2) + "\n"
    return text


def tree(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): normalized(p) for p in sorted(repo.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("spec_name", GPU_SPECS)
def test_generated_tree_matches_golden(spec_name: str, tmp_path: Path) -> None:
    repo = generate(spec_name, tmp_path)
    got = tree(repo)
    golden = GOLDEN / spec_name
    want = check_golden_tree(golden, got)
    assert sorted(got) == sorted(want), "run with TRTSPEC_UPDATE_GOLDEN=1 and review the diff"
    for rel, text in want.items():
        assert got[rel] == text, f"{rel} differs from tests/golden/repo/{spec_name}/{rel}"


@pytest.mark.parametrize("spec_name", GPU_SPECS)
def test_golden_engine_models_use_only_template_names(spec_name: str, tmp_path: Path) -> None:
    repo = generate(spec_name, tmp_path)
    inputs, outputs = template_names("tensorrtllm_template_names_0.20.txt")
    engines = 0
    for path in repo.glob("*/config.pbtxt"):
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        if config.backend != "tensorrtllm":
            continue
        engines += 1
        assert "${" not in path.read_text()
        assert {t.name for t in config.input} <= inputs, path
        assert {t.name for t in config.output} <= outputs, path
        params = {k: v.string_value for k, v in config.parameters.items()}
        assert params["gpt_model_type"] == "inflight_fused_batching"
        assert params["gpt_model_path"] == str(ENGINES / spec_name / config.name)
    assert engines >= 4


@pytest.mark.parametrize(
    ("version", "template"),
    [
        ("0.17.0", "0.17"),
        ("0.18.2", "0.17"),
        ("0.19.0", "0.19"),
        ("0.20.0", "0.20"),
        ("0.21.0", "0.20"),
        ("1.0.0", "1.0"),
        ("1.1.0", "0.20"),
        ("1.2.1", "0.20"),
    ],
)
def test_contract_names_exist_in_the_official_template(version: str, template: str) -> None:
    template = "0.20" if template == "1.0" else template
    inputs, outputs = template_names(f"tensorrtllm_template_names_{template}.txt")
    contract = engine_contract(version)
    assert set(contract.input_names()) <= inputs
    assert set(contract.output_names()) <= outputs
    seed, min_tokens = (
        ("seed", "min_tokens") if template == "0.20" else ("random_seed", "min_length")
    )
    assert {seed, min_tokens} <= set(contract.input_names())
    since_019 = {*LOOKAHEAD_INPUTS, "return_perf_metrics"}
    # optional in every template from v0.17.0 (tensorrtllm_template_names_0.17.txt)
    assert next(t for t in contract.inputs if t.name == "input_ids").optional
    if version.startswith(("0.17", "0.18")):
        # first shipped in v0.19 (reference §2, drift item 4)
        assert not since_019 & set(contract.input_names())
        # the KV-reuse outputs are there from v0.17.0, asked for by their own input
        assert contract.reuse_stats_input == "return_kv_cache_reuse_stats"
        assert contract.reuse_stats_input in contract.input_names()
        assert set(PERF_OUTPUTS) & set(contract.output_names()) == set(KV_REUSE_OUTPUTS)
    else:
        assert contract.reuse_stats_input == "return_perf_metrics"
        assert since_019 <= set(contract.input_names())
        assert set(PERF_OUTPUTS) <= set(contract.output_names())


def test_template_name_files_have_the_documented_counts() -> None:
    # [B-0.19]: 60 inputs / 19 outputs; [T] adds two of each (reference §2, §10)
    assert tuple(map(len, template_names("tensorrtllm_template_names_0.17.txt"))) == (53, 12)
    assert tuple(map(len, template_names("tensorrtllm_template_names_0.19.txt"))) == (60, 19)
    assert tuple(map(len, template_names("tensorrtllm_template_names_0.20.txt"))) == (62, 21)


def test_unsupported_version_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"TensorRT-LLM 1\.3\.0 is outside the supported range"):
        engine_contract("1.3.0")
    with pytest.raises(ValueError, match="not a TensorRT-LLM version: 'latest'"):
        engine_contract("latest")


def test_use_draft_logits_is_wired_through_the_generated_repository(tmp_path: Path) -> None:
    """use_draft_logits: the draft is built with --gather_generation_logits,
    its orchestrator is told to forward the rows, and both engines declare the
    logits tensors with the engines' logits dtype (float32: TYPE_FP32), as
    upstream's template does with ${logits_datatype}."""
    source = ROOT / "build_specs" / "qwen2.5-7b.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data.pop("routes", None)
    data["variants"][0]["use_draft_logits"] = True
    spec = parse_spec(data, str(source), source_path=source)
    plan = make_plan(spec, ENGINES)
    repo = assemble(spec, plan, ENGINES, tmp_path, require_engines=False)

    def config(name: str):
        return text_format.Parse(
            (repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
        )

    draft_engine = plan.variants["draft"].draft
    build = next(s for s in plan.steps if s.id == f"build:{draft_engine}")
    assert "--gather_generation_logits" in build.argv
    assert config("draft").parameters["use_draft_logits"].string_value == "true"
    fp32 = model_config_pb2.DataType.Value("TYPE_FP32")
    boolean = model_config_pb2.DataType.Value("TYPE_BOOL")
    for name in (draft_engine, plan.variants["draft"].target):
        engine = config(name)
        inputs = {t.name: t for t in engine.input}
        outputs = {t.name: t for t in engine.output}
        assert (
            inputs["draft_logits"].data_type,
            list(inputs["draft_logits"].dims),
            inputs["draft_logits"].optional,
        ) == (fp32, [-1, -1], True)
        assert (
            outputs["generation_logits"].data_type,
            list(outputs["generation_logits"].dims),
        ) == (fp32, [-1, -1, -1])
        assert inputs["return_generation_logits"].data_type == boolean
    # the other draft-loop variant keeps matching
    assert config("ngram").parameters.get("use_draft_logits") is None
