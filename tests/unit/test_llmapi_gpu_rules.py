"""What the LLM-API flow writes and refuses for a GPU, from TensorRT-LLM's
sources at the pinned versions (each fact's file and commit in the code and
data it tests): sampling one-model variants (``allow_advanced_sampling``,
DecodingBaseConfig in llm_args.py, search-index file id 7019226376 = the 1.2
table), the iteration stats trtllm-serve's spec-decode counters need
(tensorrt_llm/serve/openai_server.py at 00057725), where a decided
``max_concurrency`` acts, the cross-field rules of ``speculative_config``
(llm_args.py at 0004396 for 1.3), the published versions, the checkpoints
``validate`` refuses (MTP without MTP layers, EAGLE-1 as Eagle3), the fields
the flow drops, and the KV budget per variant (``max_tokens``)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from trtspec.artifacts.routing import RouteRule, RoutingTable
from trtspec.cli.main import cli
from trtspec.errors import SpecError
from trtspec.flows import llmapi_config as config
from trtspec.flows import make_plan
from trtspec.flows.llmapi_memory import UNEVEN_SPLIT, llmapi_memory_plan
from trtspec.runtime.engine.llmapi_model import Speculation
from trtspec.runtime.llm_args import field_problems, rules, schedule_draft_len
from trtspec.spec import parse_spec

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
}


def _folder(
    root: Path, name: str, cfg: dict[str, Any], tensors: dict[str, list[int]] | None = None
) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if tensors:
        header = json.dumps(
            {n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for n, s in tensors.items()}
        ).encode()
        (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def _data(variants: list[dict[str, Any]], target: str = "org/target", **top: Any) -> dict[str, Any]:
    flow = top.pop("flow", {})
    return {
        "name": "x",
        "backend": "tensorrt_llm",
        "flow": {"kind": "llmapi", **flow},
        "target": {"model": target, "family": "llama", "max_batch_size": 16},
        "variants": variants,
        **top,
    }


EAGLE = {
    "name": "e3",
    "mode": "eagle",
    "checkpoint": "org/eagle3",
    "num_eagle_layers": 3,
    "eagle_choices": [[0], [0, 0], [0, 0, 0]],
}
MTP = {"name": "mtp", "mode": "mtp", "max_draft_len": 2}
NGRAM = {"name": "ng", "mode": "ngram", "max_draft_len": 4}


def _errors(data: dict[str, Any], base: Path | None = None) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data, str((base or Path.cwd()) / "spec.yaml"))
    return str(info.value)


# ------------------------------------------------------ sampling and counters
@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc22"])
def test_a_sampled_route_samples_on_one_model_variants(version: str) -> None:
    """Eagle3 and MTP at T=0.7: allow_advanced_sampling, which 1.2.1 needs
    ("Only applicable to 1-model code paths") and 1.3 at 0004396 accepts as
    a no-op; the two-model NGram needs none. Every file passes its table."""
    data = _data([EAGLE, MTP, NGRAM], flow={"trtllm_version": version})
    data["bench"] = {"temperatures": [0.0, 0.7]}
    docs = config.documents(parse_spec(data, "spec.yaml"), None)
    assert docs["e3"]["speculative_config"]["allow_advanced_sampling"] is True
    assert docs["mtp"]["speculative_config"]["allow_advanced_sampling"] is True
    assert "allow_advanced_sampling" not in docs["ng"]["speculative_config"]
    for doc in docs.values():
        assert field_problems(doc, version) == []
    greedy = config.documents(
        parse_spec(_data([EAGLE], flow={"trtllm_version": version}), "s"), None
    )
    assert "allow_advanced_sampling" not in greedy["e3"]["speculative_config"]


def test_a_route_of_its_own_at_t_above_0_counts_too(tmp_path: Path) -> None:
    (tmp_path / "chat.jsonl").write_text('{"prompt": "hi"}\n')
    data = _data([EAGLE])
    data["routes"] = {"chat": {"prompts": str(tmp_path / "chat.jsonl"), "temperatures": [0.7]}}
    docs = config.documents(parse_spec(data, str(tmp_path / "spec.yaml")), None)
    assert docs["e3"]["speculative_config"]["allow_advanced_sampling"] is True


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc22"])
def test_every_file_enables_the_counters_the_bench_reads(version: str) -> None:
    spec = parse_spec(_data([EAGLE, MTP, NGRAM], flow={"trtllm_version": version}), "spec.yaml")
    for doc in config.documents(spec, None).values():
        assert doc["return_perf_metrics"] is True and doc["enable_iter_perf_stats"] is True


# ------------------------------------------------- where a load limit acts
def test_a_decided_limit_is_written_only_where_the_llm_api_honours_it() -> None:
    table = RoutingTable(
        routes={
            "a": RouteRule("e3", max_concurrency=4),
            "b": RouteRule("mtp", max_concurrency=4),
            "c": RouteRule("ng", max_concurrency=4),
        }
    )
    old = config.documents(parse_spec(_data([EAGLE, MTP, NGRAM]), "s"), None, table)
    # 1.2.1: one-model paths have no Drafter, whose should_use_spec_decode reads it
    assert "max_concurrency" not in old["e3"]["speculative_config"]
    assert "max_concurrency" not in old["mtp"]["speculative_config"]
    assert old["ng"]["speculative_config"]["max_concurrency"] == 4
    data = _data([EAGLE, NGRAM], flow={"trtllm_version": "1.3.0rc22"})
    new = config.documents(parse_spec(data, "s"), None, table)
    assert new["e3"]["speculative_config"]["max_concurrency"] == 4
    # 1.3: max_concurrency and draft_len_schedule exclude each other
    data["flow"]["llm_args"] = {"speculative_config": {"draft_len_schedule": {4: 4, 8: 2}}}
    data["variants"] = [NGRAM]
    spec = parse_spec(data, "s")
    doc = config.documents(spec, None, table)["ng"]
    assert "max_concurrency" not in doc["speculative_config"]
    assert field_problems(doc, "1.3.0rc22") == []
    # a schedule that does not start at the variant's draft length: at the spec
    data["variants"] = [{**NGRAM, "max_draft_len": 3}]
    assert (
        "flow.llm_args.speculative_config.draft_len_schedule: for variant 'ng' (max_draft_len "
        "3): the smallest batch size (4) must map to max_draft_len (3), got 4"
    ) in _errors(data)


# ----------------------------------------------------------- the rules
def test_the_cross_field_rules_of_each_version() -> None:
    base = {"model": "m", "speculative_config": {"decoding_type": "NGram", "max_draft_len": 4}}

    def problems(version: str, **sc: Any) -> list[tuple[str, str]]:
        doc = {**base, "speculative_config": {**base["speculative_config"], **sc}}
        return field_problems(doc, version)

    # 1.2.1: the schedule must hold batch size 1, mapped to max_draft_len
    assert problems("1.2.1", draft_len_schedule={2: 4}) == [
        (
            "speculative_config.draft_len_schedule",
            "must include batch size 1 (add {1: <max_draft_len>})",
        )
    ]
    assert problems("1.2.1", draft_len_schedule={1: 3}) == [
        (
            "speculative_config.draft_len_schedule",
            "the smallest batch size (1) must map to max_draft_len (4), got 3",
        )
    ]
    assert problems("1.2.1", draft_len_schedule={1: 4, 8: 2}, max_concurrency=0) == []
    # 1.3 (0004396): the smallest key carries max_draft_len; exclusive; max_concurrency > 0
    assert problems("1.3.0rc22", draft_len_schedule={4: 4, 8: 2}) == []
    assert problems("1.3.0rc22", draft_len_schedule={4: 4}, max_concurrency=8) == [
        (
            "speculative_config.draft_len_schedule",
            "max_concurrency and draft_len_schedule exclude each other at this version; keep one",
        )
    ]
    assert problems("1.3.0rc22", max_concurrency=0) == [
        ("speculative_config.max_concurrency", "must be >= 1, got 0")
    ]
    assert problems("1.3.0rc22", draft_len_schedule={4: 5}) == [
        (
            "speculative_config.draft_len_schedule",
            "the smallest batch size (4) must map to max_draft_len (4), got 5",
        )
    ]


def test_the_1_3_acceptance_gate_has_its_1_3_names() -> None:
    """At 0004396 the gate is acceptance_rate_window_size/threshold; the 1.2
    names are gone (what the old table accepted)."""
    sc = {"decoding_type": "NGram", "max_draft_len": 4}
    new = {"acceptance_rate_window_size": 16, "acceptance_rate_threshold": 0.3}
    assert field_problems({"model": "m", "speculative_config": {**sc, **new}}, "1.3.0rc22") == []
    old = {"model": "m", "speculative_config": {**sc, "acceptance_window": 16}}
    assert field_problems(old, "1.3.0rc22")[0][0] == "speculative_config.acceptance_window"
    assert field_problems(old, "1.2.1") == []


def test_schedule_keys_read_as_each_version_reads_them() -> None:
    """1.2: "batch_size >= 4 uses draft_len=2" (the largest key not above);
    1.3: "{4:4, 8:2, 32:1}: batch sizes 1-4 use 4 … 33+ use 0"."""
    assert rules("1.2.1")["draft_len_schedule"]["keys"] == "lower_bound"
    assert rules("1.3.0rc22")["draft_len_schedule"]["keys"] == "upper_bound"
    old = {1: 4, 4: 2, 8: 0}
    assert [schedule_draft_len(old, n, "lower_bound") for n in (1, 3, 4, 7, 8, 20)] == [
        4, 4, 2, 2, 0, 0,
    ]  # fmt: skip
    new = {4: 4, 8: 2, 32: 1}
    assert [schedule_draft_len(new, n, "upper_bound") for n in (1, 4, 5, 8, 9, 32, 33)] == [
        4, 4, 2, 2, 1, 1, 0,
    ]  # fmt: skip
    stand_in = Speculation("ngram", 4, draft_len_schedule=new, schedule_keys="upper_bound")
    assert [stand_in.draft_len(n) for n in (1, 5, 33)] == [4, 2, 0]


def test_an_unpublished_version_is_refused_with_the_one_to_use() -> None:
    message = _errors(_data([NGRAM], flow={"trtllm_version": "1.3.0rc20"}))
    assert "TensorRT-LLM 1.3.0rc20 was never published on PyPI" in message
    assert "set trtllm_version: 1.3.0rc22" in message


# ------------------------------------------------------------ refusals
def test_what_fails_on_a_gpu_is_refused_at_validate() -> None:
    data = _data([NGRAM], flow={"decoupled": False})
    assert "flow.decoupled: trtspec streams every request to the llmapi model" in _errors(data)
    data = _data([NGRAM])
    data["target"]["instances"] = 2
    assert "target.instances: the LLM-API flow serves one LLM per variant" in _errors(data)
    draft = {
        "name": "dt",
        "mode": "draft_model",
        "draft": {"model": "org/draft", "family": "llama", "dtype": "float16", "tp": 2},
        "max_draft_len": 3,
        "use_draft_logits": True,
    }
    message = _errors(_data([draft]))
    for field in ("draft.dtype", "draft.tp", "use_draft_logits"):
        assert f"variants[0].{field}: the LLM-API flow's Draft_Target has no field for" in message


def test_mtp_needs_a_target_with_mtp_layers(tmp_path: Path) -> None:
    llama = _folder(tmp_path, "llama", LLAMA)
    message = _errors(_data([MTP], target=str(llama)), tmp_path)
    assert "target.model: MTP drafts with the target's own MTP layers" in message
    deepseek = _folder(tmp_path, "dsv3", {**LLAMA, "num_nextn_predict_layers": 1})
    parse_spec(_data([MTP], target=str(deepseek)), str(tmp_path / "spec.yaml"))


def test_an_eagle_1_checkpoint_is_not_run_as_eagle3(tmp_path: Path) -> None:
    eagle1 = _folder(
        tmp_path, "eagle1", {**LLAMA, "num_hidden_layers": 1}, {"fc.weight": [256, 512]}
    )
    message = _errors(_data([{**EAGLE, "checkpoint": str(eagle1)}]), tmp_path)
    assert "is an EAGLE-1/2 checkpoint (fc.weight is [256, 512]: 2 × hidden (256)" in message
    eagle3 = _folder(
        tmp_path, "eagle3", {**LLAMA, "architectures": ["LlamaForCausalLMEagle3"]},
        {"fc.weight": [256, 768]},
    )  # fmt: skip
    parse_spec(_data([{**EAGLE, "checkpoint": str(eagle3)}]), str(tmp_path / "spec.yaml"))


def test_a_reference_spec_says_what_the_stand_in_does_not_do(tmp_path: Path) -> None:
    from trtspec.spec.flows import stand_in_ignores

    data = _data([NGRAM], target="org/target")
    data["backend"] = "reference"
    data["flow"]["llm_args"] = {
        "enable_chunked_prefill": True,
        "stream_interval": 2,
        "speculative_config": {"is_keep_all": False, "max_matching_ngram_size": 2},
    }
    data["flow"]["cuda_graphs"] = False
    data["target"]["kv_cache"] = {"free_gpu_mem_fraction": 0.5}
    ignored = stand_in_ignores(parse_spec(data, "spec.yaml"))
    assert ignored == [
        "target.kv_cache's fraction and block size (only enable_reuse is read)",
        "flow.llm_args enable_chunked_prefill, speculative_config.is_keep_all",
        "flow.cuda_graphs (CUDA graphs exist on a GPU only)",
    ]


# ------------------------------------------------------------- memory
def test_each_variant_gets_a_kv_budget_of_its_own(tmp_path: Path) -> None:
    """Every variant's LLM holds its own target copy on the same GPU; with a
    GPU size each gets kv_cache_config.max_tokens (whole blocks), the pool
    split by need, so the load order no longer decides."""
    target = _folder(tmp_path, "target", LLAMA)
    spec = parse_spec(_data([NGRAM, EAGLE], target=str(target)), str(tmp_path / "spec.yaml"))
    gib = 1 << 30
    mp = llmapi_memory_plan(spec, tmp_path, 8 * gib)
    names = [e.name for e in mp.engines]
    assert names == ["baseline__llmapi", "ng__llmapi", "e3__llmapi"]
    repo = mp.fits[0]
    assert repo.engines == names and repo.verdict == "fits"
    base, ng, e3 = mp.engines
    assert base.weights == ng.weights < e3.weights  # the EAGLE-3 head on top
    assert e3.kv_per_token > base.kv_per_token  # its layer's KV in the pool
    tokens = mp.kv_tokens
    assert all(t % 32 == 0 and t > 0 for t in tokens.values())
    # a full batch fits: each takes what it needs, no more
    assert tokens["baseline__llmapi"] == base.kv_full // base.kv_per_token
    docs = config.documents(spec, None, kv_tokens=tokens)
    kv = docs["e3"]["kv_cache_config"]
    assert kv["max_tokens"] == tokens["e3__llmapi"] and kv["free_gpu_memory_fraction"] == 0.9
    small = llmapi_memory_plan(spec, tmp_path, int(3.5 * gib))
    assert small.fits[0].verdict == "does not fit" and small.warnings()


def test_validate_shows_the_plan_and_says_the_even_split_is_uneven(tmp_path: Path) -> None:
    target = _folder(tmp_path, "target", LLAMA)
    spec_file = tmp_path / "spec.yaml"
    import yaml

    spec_file.write_text(yaml.safe_dump(_data([NGRAM], target=str(target))))
    result = CliRunner().invoke(cli, ["validate", str(spec_file)])
    assert result.exit_code == 0, result.output
    assert UNEVEN_SPLIT in result.stderr
    assert "baseline__llmapi" in result.stdout and "ng__llmapi" in result.stdout
    result = CliRunner().invoke(cli, ["validate", str(spec_file), "--gpu-memory", "16GiB"])
    assert result.exit_code == 0, result.output
    assert UNEVEN_SPLIT not in result.stderr and "max_tokens" in result.stdout


def test_repo_writes_the_budget_it_planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trtspec.flows import llmapi_repo

    folder = tmp_path / "upstream"
    folder.mkdir()
    for f in llmapi_repo.UPSTREAM_FILES:
        (folder / f).write_text("# upstream stand-in file\n")
    monkeypatch.setenv(llmapi_repo.UPSTREAM_ENV, str(folder))
    target = _folder(tmp_path, "target", LLAMA)
    spec = parse_spec(_data([NGRAM], target=str(target)), str(tmp_path / "spec.yaml"))
    plan = make_plan(spec, tmp_path / "engines")
    memory = llmapi_memory_plan(spec, plan.root, 16 << 30)
    repo = llmapi_repo.assemble(spec, plan, tmp_path / "engines", tmp_path / "out", memory=memory)
    import yaml

    doc = yaml.safe_load((repo / "ng__llmapi" / "1" / "model.yaml").read_text())
    planned = llmapi_memory_plan(spec, plan.root, 16 << 30).kv_tokens["ng__llmapi"]
    assert doc["kv_cache_config"]["max_tokens"] == planned


def test_doctor_checks_the_llmapi_model_and_the_llms_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An LLM-API spec serves upstream's llmapi Python model, not the
    tensorrtllm backend: doctor looks for the folder repo copies it from
    (its default is no container's known path) and plans every LLM."""
    from trtspec import doctor
    from trtspec.flows import llmapi_repo

    target = _folder(tmp_path, "target", LLAMA)
    spec = parse_spec(_data([NGRAM, EAGLE], target=str(target)), str(tmp_path / "spec.yaml"))
    monkeypatch.setattr(doctor, "probe_trtllm_version", lambda: "1.2.1")
    monkeypatch.setattr(doctor, "probe_gpus", lambda: [doctor.Gpu("NVIDIA H100", 80 << 30)])
    monkeypatch.setattr(doctor, "probe_tritonserver", lambda: "/opt/tritonserver/bin/tritonserver")
    monkeypatch.setattr(doctor, "probe_shm", lambda: 2 << 30)
    monkeypatch.delenv(llmapi_repo.UPSTREAM_ENV, raising=False)
    checks = {c.name: c for c in doctor.run_checks(spec, make_plan(spec, tmp_path / "e"))}
    assert "tensorrtllm backend" not in checks
    model = checks["llmapi model"]
    assert model.status == doctor.BLOCKER and "TRTLLM_LLMAPI_MODEL_DIR unset" in model.detail
    memory = checks["GPU memory"]
    assert memory.status == doctor.OK and memory.detail.startswith("80.0 GiB per GPU; the repo")
    folder = tmp_path / "upstream"
    folder.mkdir()
    for f in llmapi_repo.UPSTREAM_FILES:
        (folder / f).write_text("#\n")
    monkeypatch.setenv(llmapi_repo.UPSTREAM_ENV, str(folder))
    checks = {c.name: c for c in doctor.run_checks(spec, make_plan(spec, tmp_path / "e"))}
    assert checks["llmapi model"].status == doctor.OK


def test_the_stand_in_refuses_what_the_pinned_llm_refuses(tmp_path: Path) -> None:
    """Upstream's model passes model.yaml to LLM(**args), whose pydantic
    models refuse unknown keys and break DecodingBaseConfig's rules: the
    stand-in refuses the same file at load, naming the field."""
    from trtspec.runtime.engine.llmapi_model import LlmApiConfigError, check_llm_args

    path = tmp_path / "model.yaml"
    sc = {"decoding_type": "NGram", "max_draft_len": 4, "draft_len_schedule": {2: 4}}
    with pytest.raises(LlmApiConfigError, match="draft_len_schedule: must include batch size 1"):
        check_llm_args({"model": "m", "speculative_config": sc}, "1.2.1", path)
    with pytest.raises(LlmApiConfigError, match="max_batch: unknown field; did you mean"):
        check_llm_args({"model": "m", "max_batch": 4}, "1.3.0rc22", path)
    check_llm_args({"model": "m", "max_batch": 4}, None, path)  # no version named: not held


@pytest.mark.parametrize(("version", "tag"), [("1.2.1", "v1.2.1"), ("1.3.0rc22", "v1.3.0rc22")])
def test_each_table_header_names_its_tag_and_commit(version: str, tag: str) -> None:
    from trtspec.runtime.llm_args import table

    source = table(version)["source"]
    assert source["tag"] == tag and version in table(version)["pins"]
    assert source.get("commit") or source.get("why_no_commit")
    assert "not the tag" in source["read_at"]
    assert set(table(version)["speculative_config"]["rules"]) == {
        "source",
        "exclusive",
        "draft_len_schedule",
        "one_model_sampling",
    }


def test_a_bench_at_t_above_0_the_files_were_not_written_for_is_named() -> None:
    """--temperatures 0.7 over a spec written at T=0: 1.2.1's Eagle3/MTP files
    lack allow_advanced_sampling, so the bench warns (greedy decoding)."""
    spec = parse_spec(_data([EAGLE, NGRAM]), "spec.yaml")
    message = config.greedy_at(spec, [0.0, 0.7])
    assert message is not None and message.startswith("variant(s) e3 were written without")
    assert config.greedy_at(spec, [0.0]) is None
    newer = parse_spec(_data([EAGLE], flow={"trtllm_version": "1.3.0rc22"}), "spec.yaml")
    assert config.greedy_at(newer, [0.7]) is None  # sampling is per request at 0004396


def test_build_writes_the_budget_trtllm_serve_reads(tmp_path: Path) -> None:
    """trtllm-serve (serve-llmapi) reads engines/<spec>/llmapi/<variant>.yaml:
    `trtspec build --gpu-memory` plans each server's KV there too."""
    import yaml

    target = _folder(tmp_path, "target", LLAMA)
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(_data([NGRAM], target=str(target))))
    engines = tmp_path / "engines"
    args = ["build", str(spec_file), "--engines", str(engines), "--gpu-memory", "16GiB"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    doc = yaml.safe_load((engines / "x" / "llmapi" / "ng.yaml").read_text())
    spec = parse_spec(yaml.safe_load(spec_file.read_text()), str(spec_file))
    planned = llmapi_memory_plan(spec, engines / "x", 16 << 30).kv_tokens["ng__llmapi"]
    assert doc["kv_cache_config"]["max_tokens"] == planned
