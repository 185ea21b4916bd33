"""The LLM-API flow without a server: the llm_args field tables (data read from
TensorRT-LLM's llm_args.py at the pinned versions, source named in each file),
the spec's ``flow`` union and its rules (exact messages), the LLM-argument
file of every mode at both pinned versions, the GPU plan (nothing to build,
files only), ``trtspec build`` writing the files and failing before any step,
the repository layout of the llmapi models, and the CPU stand-in's load rules
(``max_concurrency``, ``draft_len_schedule``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.errors import RepoError, SpecError
from trtspec.flows import flow_for, llmapi_repo, make_plan
from trtspec.flows import llmapi_config as config
from trtspec.repo.check import check_repository
from trtspec.repo.configs import read_config
from trtspec.runtime.engine.llmapi_model import (
    LlmApiConfigError,
    Speculation,
    answers_at,
    read_model_yaml,
    speculation_of,
    stream_interval_of,
)
from trtspec.runtime.llm_args import PINNED, decoding_types, field_problems, table
from trtspec.spec import parse_spec

VERSIONS = sorted(PINNED)


def _spec(variants: list[dict[str, Any]], **flow: Any) -> Any:
    data = {
        "name": "x",
        "backend": "tensorrt_llm",
        "flow": {"kind": "llmapi", **flow},
        "target": {"model": "org/target", "family": "llama", "max_batch_size": 16},
        "variants": variants,
    }
    return parse_spec(data, "spec.yaml")


ALL_MODES = [
    {"name": "ngram", "mode": "ngram", "max_draft_len": 5, "max_matching_ngram_size": 3},
    {
        "name": "dt",
        "mode": "draft_model",
        "draft": {"model": "org/draft", "family": "llama"},
        "max_draft_len": 4,
    },
    {
        "name": "e3",
        "mode": "eagle",
        "checkpoint": "org/eagle3",
        "num_eagle_layers": 3,
        "eagle_choices": [[0], [0, 0], [0, 0, 0]],
    },
    {"name": "mtp", "mode": "mtp", "max_draft_len": 2},
]


# ---------------------------------------------------------------- the tables
@pytest.mark.parametrize("version", VERSIONS)
def test_each_table_names_its_source(version: str) -> None:
    source = table(version)["source"]
    assert source["repo"] == "NVIDIA/TensorRT-LLM"
    assert source["path"] == "tensorrt_llm/llmapi/llm_args.py"
    assert "nearest stored" in source["how_version_is_known"]
    assert "commit" in source or "index" in source["read"]


def test_decoding_types_differ_by_version() -> None:
    old, new = decoding_types("1.2.1"), decoding_types("1.3.0rc22")
    assert {"Draft_Target", "NGram", "Eagle3", "MTP"} <= set(old) & set(new)
    assert "SA" in new and "SA" not in old
    assert not old["Medusa"]["pytorch"] and not old["Lookahead"]["pytorch"]
    assert "Medusa" not in new and "Lookahead" not in new


def test_a_clean_document_passes_and_typos_are_named() -> None:
    doc = {
        "model": "m",
        "kv_cache_config": {"free_gpu_memory_fraction": 0.5, "enable_blok_reuse": True},
        "max_batch_size": True,
        "speculative_config": {"decoding_type": "NGram", "max_draft_len": 3},
    }
    assert field_problems(doc, "1.2.1") == [
        ("max_batch_size", "must be int or null, got bool True"),
        ("kv_cache_config.enable_blok_reuse", "unknown field; did you mean 'enable_block_reuse'?"),
    ]
    doc = {"model": "m", "speculative_config": {"decoding_type": "SA", "max_draft_len": 3}}
    assert field_problems(doc, "1.3.0rc22") == []
    assert field_problems(doc, "1.2.1") == [
        (
            "speculative_config.decoding_type",
            "'SA' is not a decoding type of TensorRT-LLM 1.2.1; use one of Draft_Target, NGram, "
            "Eagle, Eagle3, MTP, Medusa, Lookahead, User_Provided, SaveState, PARD, AUTO",
        )
    ]


def test_aliases_and_ranges() -> None:
    doc = {
        "model": "m",
        "kv_cache_config": {"free_gpu_memory_fraction": 1.5},
        "speculative_config": {
            "decoding_type": "Draft_Target",
            "max_draft_len": 3,
            "speculative_model_dir": "/d",
        },
    }
    assert field_problems(doc, "1.3.0rc22") == [
        ("kv_cache_config.free_gpu_memory_fraction", "must be <= 1, got 1.5")
    ]


# ----------------------------------------------------------------- the spec
def test_an_engine_spec_is_unchanged() -> None:
    spec = parse_spec({"name": "x", "target": {"model": "org/m", "family": "llama"}}, "spec.yaml")
    assert spec.flow.kind == "engine" and spec.flow.per_request_draft_len


def test_the_shorthand_and_the_defaults() -> None:
    spec = parse_spec(
        {"name": "x", "flow": "llmapi", "target": {"model": "org/m", "family": "llama"}},
        "spec.yaml",
    )
    assert spec.flow.kind == "llmapi"
    assert spec.flow.trtllm_version == "1.2.1"
    assert not spec.flow.per_request_draft_len


def _errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(data, "spec.yaml")
    return [line.split(": ", 1)[1] for line in info.value.issues]


def test_medusa_and_lookahead_are_refused_with_the_engine_flow_named() -> None:
    errors = _errors(
        {
            "name": "x",
            "flow": "llmapi",
            "target": {"model": "org/m", "family": "llama"},
            "variants": [
                {
                    "name": "la",
                    "mode": "lookahead",
                    "window_size": 2,
                    "ngram_size": 3,
                    "verification_set_size": 2,
                },
            ],
        }
    )
    assert errors == [
        "variants[0].mode: lookahead decoding exists only in TensorRT-LLM's engine flow "
        "(trtllm-build + Triton's tensorrtllm backend), not in the LLM-API (PyTorch) flow; "
        "use `flow: engine` (last container serving it: NGC Triton 26.07 "
        "(nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3), TensorRT-LLM 1.2.1) or drop "
        "the variant"
    ]


def test_mtp_needs_the_llmapi_flow_and_a_gpu() -> None:
    base = {
        "name": "x",
        "target": {"model": "org/m", "family": "llama"},
        "variants": [{"name": "m", "mode": "mtp"}],
    }
    assert _errors(base) == [
        "variants[0].mode: mode 'mtp' is served by the LLM-API flow only (TensorRT-LLM's "
        "PyTorch flow); set `flow: llmapi` or drop the variant"
    ]
    assert _errors({**base, "flow": "llmapi", "backend": "reference"}) == [
        "variants[0].mode: MTP needs a GPU: the reference backend has no MTP weights path in "
        "the LLM-API flow; set backend: tensorrt_llm or drop the variant"
    ]


def test_llm_args_are_checked_at_the_spec_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: x\n"
        "flow:\n"
        "  kind: llmapi\n"
        "  llm_args:\n"
        "    enable_chunked_prefill: true\n"
        "    kv_cache_config: {dtype: fp8, free_gpu_mem_fraction: 0.5}\n"
        "target: {model: org/m, family: llama}\n"
    )
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[:2] == [
        f"Error: {path}:6:35: flow.llm_args.kv_cache_config.free_gpu_mem_fraction: unknown "
        "field; did you mean 'free_gpu_memory_fraction'? (llm_args.py of TensorRT-LLM 1.2.1)",
        "Hint: fix the fields named above; `trtspec validate` rechecks",
    ]


def test_the_suffix_automaton_needs_1_3() -> None:
    ngram = [{"name": "n", "mode": "ngram", "max_draft_len": 4}]
    data = {
        "name": "x",
        "flow": {"kind": "llmapi", "suffix_automaton": True},
        "target": {"model": "org/m", "family": "llama"},
        "variants": ngram,
    }
    assert _errors(data) == [
        "flow.suffix_automaton: the suffix-automaton drafter (decoding_type SA) arrived after "
        "TensorRT-LLM 1.2.1; set flow.trtllm_version: 1.3.0rc22 or suffix_automaton: false"
    ]
    data["flow"]["trtllm_version"] = "1.3.0rc22"
    spec = parse_spec(data, "spec.yaml")
    assert config.documents(spec, None)["n"]["speculative_config"] == {
        "decoding_type": "SA",
        "max_draft_len": 4,
    }


# ------------------------------------------------------- generated documents
@pytest.mark.parametrize("version", VERSIONS)
def test_every_mode_has_its_decoding_type(version: str) -> None:
    spec = _spec(ALL_MODES, trtllm_version=version)
    docs = config.documents(spec, None)  # raises if a document fails its table
    assert sorted(docs) == ["baseline", "dt", "e3", "mtp", "ngram"]
    mtp = {"1.2.1": {"num_nextn_predict_layers": 2}, "1.3.0rc22": {"max_draft_len": 2}}[version]
    assert {n: d.get("speculative_config") for n, d in docs.items()} == {
        "baseline": None,
        "ngram": {
            "decoding_type": "NGram",
            "max_draft_len": 5,
            "max_matching_ngram_size": 3,
            "is_public_pool": False,
        },
        "dt": {
            "decoding_type": "Draft_Target",
            "max_draft_len": 4,
            "speculative_model": "org/draft",
        },
        "e3": {
            "decoding_type": "Eagle3",
            "max_draft_len": 3,
            "speculative_model": "org/eagle3",
            "eagle3_one_model": True,
        },
        "mtp": {"decoding_type": "MTP", **mtp},
    }
    base = docs["baseline"]
    assert base["model"] == "org/target"
    assert base["max_batch_size"] == 16
    assert base["kv_cache_config"] == {
        "free_gpu_memory_fraction": round(0.9 / 5, 4),
        "enable_block_reuse": True,
        "tokens_per_block": 32,
    }
    for doc in docs.values():
        assert field_problems(doc, version) == []


def test_llm_args_merge_into_every_file() -> None:
    spec = _spec(
        ALL_MODES[:1],
        llm_args={
            "enable_chunked_prefill": True,
            "kv_cache_config": {"dtype": "fp8"},
            "speculative_config": {"max_concurrency": 8},
        },
        cuda_graphs=False,
    )
    docs = config.documents(spec, None)
    assert docs["baseline"]["enable_chunked_prefill"] is True
    assert docs["baseline"]["kv_cache_config"]["dtype"] == "fp8"
    assert docs["baseline"]["cuda_graph_config"] is None
    assert "speculative_config" not in docs["baseline"]
    assert docs["ngram"]["speculative_config"]["max_concurrency"] == 8
    assert docs["ngram"]["kv_cache_config"]["enable_block_reuse"] is True


# ------------------------------------------------------------ plan and build
def test_a_gpu_plan_builds_nothing_and_writes_one_file_per_variant(tmp_path: Path) -> None:
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "name": "gpu",
                "flow": "llmapi",
                "target": {"model": "org/target", "family": "llama"},
                "variants": ALL_MODES,
            }
        )
    )
    engines = tmp_path / "engines"
    result = CliRunner().invoke(
        cli, ["build", str(spec_file), "--engines", str(engines), "--dry-run", "--format", "json"]
    )
    assert result.exit_code == 0, result.stderr
    planned = json.loads(result.stdout)
    assert planned["steps"] == []
    assert sorted(Path(p).name for p in planned["files"]) == [
        "baseline.yaml",
        "dt.yaml",
        "e3.yaml",
        "mtp.yaml",
        "ngram.yaml",
    ]
    assert not engines.exists()
    result = CliRunner().invoke(cli, ["build", str(spec_file), "--engines", str(engines)])
    assert result.exit_code == 0, result.stderr
    written = yaml.safe_load((engines / "gpu" / "llmapi" / "mtp.yaml").read_text())
    assert written["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 2}
    plan = make_plan(parse_spec(yaml.safe_load(spec_file.read_text()), str(spec_file)))
    assert {n: v.target for n, v in plan.variants.items()}["mtp"] == "mtp__llmapi"


def test_a_bad_generated_file_fails_before_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(ALL_MODES[:1])
    real = config.llm_args

    def misspelled(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**real(*args, **kwargs), "max_num_token": 8}

    monkeypatch.setattr(config, "llm_args", misspelled)
    with pytest.raises(config.LlmApiError) as info:
        flow_for(spec).files(spec, make_plan(spec), tmp_path)
    assert (
        "llmapi/baseline.yaml: max_num_token: unknown field; did you mean 'max_num_tokens'?"
        in info.value.message
    )


# --------------------------------------------------------------- repository
def _fake_upstream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stand-ins for the llmapi model files a GPU repository copies."""
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    for name in llmapi_repo.UPSTREAM_FILES:
        (upstream / name).write_text(f"# {name}\n")
    monkeypatch.setenv(llmapi_repo.UPSTREAM_ENV, str(upstream))


def test_the_gpu_repository_uses_upstreams_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = _spec(ALL_MODES[:2])
    plan = make_plan(spec)
    monkeypatch.setenv(llmapi_repo.UPSTREAM_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(RepoError) as info:
        flow_for(spec).assemble(spec, plan, tmp_path, tmp_path / "out", routing=None, memory=None)
    assert "TensorRT-LLM's llmapi Triton model (model.py, helpers.py) not found" in str(
        info.value.message
    )
    _fake_upstream(tmp_path, monkeypatch)
    repo = flow_for(spec).assemble(
        spec, plan, tmp_path, tmp_path / "out", routing=None, memory=None
    )
    assert sorted(p.name for p in repo.iterdir()) == [
        "baseline",
        "baseline__llmapi",
        "dt",
        "dt__llmapi",
        "ngram",
        "ngram__llmapi",
        "router",
        "trtspec-repo.json",
    ]
    assert [g.count for g in read_config(repo / "router" / "config.pbtxt").instance_group] == [1]
    llm = repo / "dt__llmapi"
    assert (llm / "1" / "helpers.py").read_text() == "# helpers.py\n"
    model_yaml = yaml.safe_load((llm / "1" / "model.yaml").read_text())
    assert model_yaml["triton_config"] == {
        "max_batch_size": 0,
        "decoupled": True,
        "cancellation_check_period_ms": 100,
    }
    assert model_yaml["speculative_config"]["decoding_type"] == "Draft_Target"
    cfg = read_config(llm / "config.pbtxt")
    assert cfg.backend == "python" and cfg.max_batch_size == 0
    assert [t.name for t in cfg.input][:3] == ["text_input", "streaming", "sampling_param_best_of"]
    assert "total_draft_tokens" in [t.name for t in cfg.output]
    adapter = read_config(repo / "dt" / "config.pbtxt")
    assert adapter.parameters["llm_model"].string_value == "dt__llmapi"
    assert adapter.parameters["acceptance"].string_value == "not_available"
    manifest = json.loads((repo / "trtspec-repo.json").read_text())
    assert manifest["flow"] == "llmapi"
    assert manifest["models"]["dt"]["calls"] == ["dt__llmapi"]
    assert check_repository(repo) == []


# -------------------------------------------------------- the CPU stand-in
def test_load_rules_of_the_drafter() -> None:
    s = Speculation("ngram", 4, max_concurrency=3)
    assert [s.draft_len(n) for n in (1, 3, 4)] == [4, 4, 0]
    s = Speculation("draft", 4, draft_len_schedule={1: 4, 4: 2, 8: 0})
    assert [s.draft_len(n) for n in (1, 3, 4, 7, 8, 20)] == [4, 4, 2, 2, 0, 0]


def test_what_the_stand_in_refuses(tmp_path: Path) -> None:
    path = tmp_path / "model.yaml"
    path.write_text("model: /m\n")
    with pytest.raises(LlmApiConfigError, match="triton_config with decoupled and max_batch_size"):
        read_model_yaml(path)
    path.write_text("model: /m\ntriton_config: {decoupled: true, max_batch_size: 0}\n")
    args, triton = read_model_yaml(path)
    assert args == {"model": "/m"} and triton["decoupled"] is True
    with pytest.raises(LlmApiConfigError, match="'Eagle3' needs a GPU"):
        speculation_of({"speculative_config": {"decoding_type": "Eagle3"}}, "model.yaml")
    sc = {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model_dir": "/d"}
    assert speculation_of({"speculative_config": sc}, "m").kind == "draft"


# ------------------------------------------------- trtllm-serve and decisions
def test_one_trtllm_serve_per_variant(tmp_path: Path) -> None:
    spec = _spec(ALL_MODES[:2])
    commands = config.serve_commands(spec, make_plan(spec), tmp_path, base_port=9100)
    folder = tmp_path / "x" / "llmapi"
    assert commands == {
        name: [
            "trtllm-serve", "org/target", "--host", "127.0.0.1", "--port", str(port),
            "--backend", "pytorch", "--extra_llm_api_options", str(folder / f"{name}.yaml"),
        ]
        for name, port in (("baseline", 9100), ("ngram", 9101), ("dt", 9102))
    }  # fmt: skip


def test_a_load_limited_promotion_is_written_back() -> None:
    from trtspec.artifacts.routing import RouteRule, RoutingTable

    spec = _spec(ALL_MODES[:2])
    table = RoutingTable(
        routes={
            "chat": RouteRule("ngram", max_concurrency=8),
            "rag": RouteRule("ngram", max_concurrency=4),
            "code": RouteRule("dt"),
        }
    )
    docs = config.documents(spec, None, table)
    assert docs["ngram"]["speculative_config"]["max_concurrency"] == 4
    assert "max_concurrency" not in docs["dt"]["speculative_config"]
    assert "speculative_config" not in docs["baseline"]


def test_the_llmapi_image_pins_the_llmapi_container_and_checks_the_model() -> None:
    text = (Path(__file__).resolve().parents[2] / "Dockerfile.llmapi").read_text()
    lines = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == "ARG TRITON_IMAGE=nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert lines[1] == "FROM ${TRITON_IMAGE}"
    assert f"ENV {llmapi_repo.UPSTREAM_ENV}=${{LLMAPI_MODEL_DIR}}" in lines
    assert f"ARG LLMAPI_MODEL_DIR={llmapi_repo.UPSTREAM_DEFAULT}" in lines
    assert 'ENTRYPOINT ["/opt/nvidia/nvidia_entrypoint.sh", "trtspec"]' in lines
    assert "import tensorrt_llm" not in text


def test_the_demo_spec_is_valid_and_its_files_pass_their_table(tmp_path: Path) -> None:
    import shutil

    from trtspec.spec import load_spec

    root = Path(__file__).resolve().parents[2]
    shutil.copytree(root / "build_specs", tmp_path / "build_specs")
    model = tmp_path / ".cache" / "models" / "smollm2-135m-instruct"  # what `make demo` fetches
    model.mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    spec = load_spec(tmp_path / "build_specs" / "demo-cpu-llmapi.yaml")
    assert spec.warnings == []
    assert spec.flow.kind == "llmapi" and spec.backend.value == "reference"
    files = flow_for(spec).files(spec, make_plan(spec, tmp_path / "engines"), tmp_path / "engines")
    docs = {p.stem: yaml.safe_load(text) for p, text in files.items()}
    assert {n: (d.get("speculative_config") or {}).get("decoding_type") for n, d in docs.items()} \
        == {"baseline": None, "ngram": "NGram", "draft_int8": "Draft_Target"}  # fmt: skip
    assert docs["draft_int8"]["model"].endswith("engines/demo-cpu-llmapi/target_dte")


def test_the_bench_finds_the_tokenizer_where_the_flow_keeps_it(tmp_path: Path) -> None:
    gpu = _spec(ALL_MODES[:1])
    assert gpu.tokenizer_dir(tmp_path) == Path("org/target")
    engine = parse_spec({"name": "e", "target": {"model": "org/m", "family": "llama"}}, "s")
    assert engine.tokenizer_dir(tmp_path) == tmp_path / "e/target/tokenizer"
    # the LLM API's CPU stand-in serves reference engines: the target engine carries it
    cpu = parse_spec(
        {
            "name": "c",
            "backend": "reference",
            "flow": "llmapi",
            "target": {"model": "org/m", "family": "llama"},
        },
        "s",
    )
    assert cpu.tokenizer_dir(tmp_path) == tmp_path / "c/target/tokenizer"


def test_the_stand_in_answers_as_the_pytorch_executor_does_with_stream_interval() -> None:
    # the first iteration, every stream_interval-th, (and the last: the caller)
    assert [i for i in range(1, 10) if answers_at(i, 1)] == list(range(1, 10))
    assert [i for i in range(1, 10) if answers_at(i, 4)] == [1, 4, 8]
    assert stream_interval_of({}, "m") == 1
    assert stream_interval_of({"stream_interval": 4}, "m") == 4
    for bad in (0, -1, True, "4", 1.5):
        with pytest.raises(LlmApiConfigError, match="m: stream_interval must be a positive"):
            stream_interval_of({"stream_interval": bad}, "m")


def test_the_llmapi_router_runs_as_many_processes_as_the_spec_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = {
        "name": "x",
        "backend": "tensorrt_llm",
        "flow": {"kind": "llmapi"},
        "target": {"model": "org/target", "family": "llama", "max_batch_size": 16},
        "router": {"instances": 4},
    }
    spec = parse_spec(data, "spec.yaml")
    _fake_upstream(tmp_path, monkeypatch)
    repo = flow_for(spec).assemble(
        spec, make_plan(spec), tmp_path, tmp_path / "out", routing=None, memory=None
    )
    assert [g.count for g in read_config(repo / "router" / "config.pbtxt").instance_group] == [4]
