"""Every ``tensorrtllm`` engine config trtspec writes is read here the way the
C++ backend of its pinned TensorRT-LLM version reads it (``tests/fixtures/
cpp_params.py`` over ``tests/data/tensorrtllm_parameters_*.txt``, both taken
from the backend sources): the golden repositories, and fresh repositories
from every example spec at every pin. A missing required key (the three
guided-decoding keys read outside any ``try``), an unparsable value or an
unknown key fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tests.fixtures import cpp_params

from trtspec.plan import make_plan
from trtspec.repo import configs
from trtspec.repo.assemble import assemble
from trtspec.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "repo"
# Every example spec that builds GPU engines (demo-cpu is reference-backend only).
EXAMPLES = sorted(
    p.stem
    for p in (ROOT / "build_specs").glob("*.yaml")
    if "backend: reference" not in p.read_text(encoding="utf-8")
)
PINS = ["0.18.2", "0.19.0", "1.1.0", "1.2.1"]
ENGINES = Path("/engines")


def engine_parameters(repo: Path) -> dict[str, dict[str, str]]:
    found = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        config = configs.read_config(path)
        if config.backend == "tensorrtllm":
            found[config.name] = configs.parameters_of(config)
    return found


def fresh_repo(spec_name: str, version: str, output: Path) -> Path | None:
    source = ROOT / "build_specs" / f"{spec_name}.yaml"
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data.pop("routes", None)
    data.setdefault("stack", {})["trtllm_version"] = version
    data["stack"].pop("triton_image", None)
    if version < "0.19" and any(v.get("mode") == "lookahead" for v in data.get("variants", [])):
        return None  # refused by the spec check (test_spec covers that message)
    spec = parse_spec(data, str(source), source_path=source)
    return assemble(spec, make_plan(spec, ENGINES), ENGINES, output, require_engines=False)


@pytest.mark.parametrize("spec_name", sorted(p.name for p in GOLDEN.iterdir()))
def test_golden_engine_configs_load_in_the_pinned_backend(spec_name: str) -> None:
    repo = GOLDEN / spec_name
    version = json.loads((repo / "trtspec-repo.json").read_text())["trtllm_version"]
    engines = engine_parameters(repo)
    assert len(engines) >= 4
    for name, params in engines.items():
        assert cpp_params.problems(params, version) == [], f"{spec_name}/{name}"


@pytest.mark.parametrize("version", PINS)
@pytest.mark.parametrize("spec_name", EXAMPLES)
def test_every_example_spec_loads_at_every_pin(
    spec_name: str, version: str, tmp_path: Path
) -> None:
    repo = fresh_repo(spec_name, version, tmp_path)
    if repo is None:
        return
    engines = engine_parameters(repo)
    assert engines, "no tensorrtllm engine model was generated"
    for name, params in engines.items():
        assert cpp_params.problems(params, version) == [], f"{spec_name}@{version}/{name}"


@pytest.mark.parametrize("version", ["0.19.0", "1.1.0", "1.2.1"])
def test_guided_decoding_keys_are_written_empty(version: str, tmp_path: Path) -> None:
    repo = fresh_repo("vicuna-7b", version, tmp_path)
    assert repo is not None
    for params in engine_parameters(repo).values():
        assert {k: params[k] for k in cpp_params.GUIDED_KEYS} == dict.fromkeys(
            cpp_params.GUIDED_KEYS, ""
        )


@pytest.mark.parametrize("version", ["0.18.2", "0.19.0", "1.2.1"])
def test_dropping_any_required_key_fails(version: str, tmp_path: Path) -> None:
    repo = fresh_repo("small-draft-model", version, tmp_path / "repo")
    assert repo is not None
    params = engine_parameters(repo)["target"]
    required = [
        k.name for k in cpp_params.load_contract(version).values() if k.status == "required"
    ]
    expected = ["gpt_model_type"] + (list(cpp_params.GUIDED_KEYS) if version >= "0.19" else [])
    assert sorted(required) == sorted(expected)
    for name in required:
        dropped = {k: v for k, v in params.items() if k != name}
        assert cpp_params.problems(dropped, version) == [
            f"{name}: Cannot find parameter with name: {name}"
        ]


def test_the_real_file_on_disk_fails_when_a_key_is_removed(tmp_path: Path) -> None:
    repo = fresh_repo("vicuna-7b", "1.1.0", tmp_path / "repo")
    assert repo is not None
    path = repo / "target" / "config.pbtxt"
    config = configs.read_config(path)
    del config.parameters["tokenizer_dir"]
    configs.write_config(path, config)
    assert cpp_params.problems(engine_parameters(repo)["target"], "1.1.0") == [
        "tokenizer_dir: Cannot find parameter with name: tokenizer_dir"
    ]


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "gpt_model_type",
            "inflight",
            "gpt_model_type: throws: 'inflight' is not one of V1, v1, "
            "inflight_batching, inflight_fused_batching",
        ),
        (
            "kv_cache_free_gpu_mem_fraction",
            "ninety",
            "kv_cache_free_gpu_mem_fraction: falls back "
            "to default: stof: no conversion of 'ninety'",
        ),
        (
            "enable_kv_cache_reuse",
            "yes",
            "enable_kv_cache_reuse: falls back to default: Cannot convert yes to a boolean.",
        ),
        (
            "decoding_mode",
            "greedy",
            "decoding_mode: falls back to default: 'greedy' is not one of "
            "top_k, top_p, top_k_top_p, beam_search, medusa, redrafter, lookahead, eagle",
        ),
        (
            "batch_scheduler_policy",
            "fifo",
            "batch_scheduler_policy: falls back to default: 'fifo' "
            "is not one of max_utilization, guaranteed_no_evict",
        ),
        (
            "eagle_choices",
            "",
            "eagle_choices: falls back to default: Cannot convert empty string "
            "to vector of vector of ints",
        ),
        (
            "max_beam_width",
            "one",
            "max_beam_width: falls back to default: stoi: no conversion of 'one'",
        ),
        (
            "worker_pth",
            "/x",
            "worker_pth: not read by the tensorrtllm backend of TensorRT-LLM 1.1.0",
        ),
    ],
)
def test_bad_values_are_reported_as_the_backend_would_treat_them(
    key: str, value: str, message: str, tmp_path: Path
) -> None:
    repo = fresh_repo("vicuna-7b", "1.1.0", tmp_path / "repo")
    assert repo is not None
    params = {**engine_parameters(repo)["target"], key: value}
    assert cpp_params.problems(params, "1.1.0") == [message]


def test_lookahead_engine_needs_its_three_parameters(tmp_path: Path) -> None:
    repo = fresh_repo("qwen2.5-7b", "1.2.1", tmp_path / "repo")
    assert repo is not None
    params = engine_parameters(repo)["target_lookahead_lookahead"]
    assert params["decoding_mode"] == "lookahead"
    del params["lookahead_ngram_size"]
    assert cpp_params.problems(params, "1.2.1") == [
        "lookahead_ngram_size: Decoding mode is set to lookahead but it is not specified"
    ]


def test_guided_decoding_turned_on_needs_xgrammar_and_an_existing_file(tmp_path: Path) -> None:
    repo = fresh_repo("vicuna-7b", "1.1.0", tmp_path / "repo")
    assert repo is not None
    params = engine_parameters(repo)["target"]
    on = {
        **params,
        "guided_decoding_backend": "outlines",
        "xgrammar_tokenizer_info_path": str(tmp_path / "missing.json"),
    }
    assert cpp_params.problems(on, "1.1.0") == [
        "guided_decoding_backend: only 'xgrammar' is supported",
        f"xgrammar_tokenizer_info_path: {tmp_path / 'missing.json'} does not exist",
    ]
    placeholder = {
        **params,
        "guided_decoding_backend": "${guided_decoding_backend}",
        "xgrammar_tokenizer_info_path": "/nowhere",
    }
    assert cpp_params.problems(placeholder, "1.1.0") == []


@pytest.mark.parametrize(
    ("text", "value"),
    [("0.15", 0.15), (" 1e-3x", 1e-3), ("inf", float("inf")), (".5", 0.5)],
)
def test_stof_reads_the_leading_number(text: str, value: float) -> None:
    assert cpp_params.stof(text) == value


def test_std_parse_rules() -> None:
    assert cpp_params.stoi(" 42abc") == 42
    assert cpp_params.stoul("-1") == 2**64 - 1
    with pytest.raises(cpp_params.CppError, match="out of range"):
        cpp_params.stoi("2147483648")
    with pytest.raises(cpp_params.CppError, match="out of range"):
        cpp_params.stof("1e39")
    assert cpp_params.to_bool("TRUE") is True and cpp_params.to_bool("0") is False
    assert cpp_params.csv_ints("0, 1,2") == [0, 1, 2]
    assert cpp_params.csv_int_lists("{0}, {0, 0}, {1}, {0, 1}") == [[0], [0, 0], [1], [0, 1]]
    # A tail without its closing brace is dropped, as getline's eof() break does.
    assert cpp_params.csv_int_lists("{0}, {1") == [[0]]
    with pytest.raises(cpp_params.CppError, match="empty string"):
        cpp_params.csv_int_lists("{}")
    assert cpp_params.id_groups("0,1;2,3") == [[0, 1], [2, 3]]
