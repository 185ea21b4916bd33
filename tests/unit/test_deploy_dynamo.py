"""`trtspec deploy dynamo` / ``trtspec.deploy.dynamo``: one DynamoGraphDeployment
per variant from hand-made LLM-API engine configs and from an LLM-API spec's
generated ones (``--spec``), validated against the pinned CRD schema
(dynamo 967e177, tests/data/deploy_schemas/README.md); aggregated,
disaggregated and multi-node; every refusal before anything is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tests.fixtures.k8s_schemas import schema_errors

from trtspec.cli.main import cli
from trtspec.deploy.dynamo import CONFIG_DIR, DynamoOptions, graph, graphs, k8s_name
from trtspec.deploy.sizing import DeployError

IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.0.0-test"
MODEL = "meta-llama/Llama-3.1-70B-Instruct"
# LLM-API options as the LLM-API flow writes them per variant (TensorRT-LLM's
# extra_llm_api_options YAML: speculative_config with decoding_type, ...).
BASELINE = {
    "tensor_parallel_size": 8,
    "max_batch_size": 64,
    "max_num_tokens": 8192,
    "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": True},
}
EAGLE3 = {
    **BASELINE,
    "speculative_config": {
        "decoding_type": "Eagle",
        "max_draft_len": 3,
        "speculative_model_dir": "yuhuili/EAGLE3-LLaMA3.1-Instruct-70B",
        "eagle3_one_model": True,
    },
}


def opts(**kw: Any) -> DynamoOptions:
    return DynamoOptions(image=IMAGE, model=MODEL, **kw)


def test_the_schema_refuses_a_misspelled_field() -> None:
    _, dgd = graph("spec", "baseline", BASELINE, opts())
    assert schema_errors(dgd) == []
    dgd["spec"]["services"]["Frontend"]["componentTyp"] = "frontend"
    dgd["spec"]["backendFramework"] = "tensorrt"
    assert schema_errors(dgd) == [
        "spec/backendFramework: 'tensorrt' is not one of ['sglang', 'vllm', 'trtllm']",
        "spec/services/Frontend: Additional properties are not allowed "
        "('componentTyp' was unexpected)",
    ]


def test_aggregated_graph_serves_the_variant_config() -> None:
    cm, dgd = graph("llama-70b", "eagle3", EAGLE3, opts(replicas=3, secret="hf-token"))
    assert schema_errors(dgd) == [] and schema_errors(cm) == []
    assert dgd["metadata"]["name"] == "llama-70b-eagle3"
    services = dgd["spec"]["services"]
    assert sorted(services) == ["Frontend", "TRTLLMWorker"]
    assert services["Frontend"]["componentType"] == "frontend"
    worker = services["TRTLLMWorker"]
    assert (worker["componentType"], worker["replicas"]) == ("worker", 3)
    assert worker["resources"]["limits"] == {"gpu": "8"}
    assert "multinode" not in worker
    assert worker["envFromSecret"] == "hf-token"
    main = worker["extraPodSpec"]["mainContainer"]
    assert main["command"] == ["python3", "-m", "dynamo.trtllm"]
    assert main["args"] == [
        "--model-path", MODEL,
        "--served-model-name", "llama-70b-eagle3",
        "--extra-engine-args", f"{CONFIG_DIR}/engine.yaml",
    ]  # fmt: skip
    # the worker reads exactly the variant's config
    assert yaml.safe_load(cm["data"]["engine.yaml"]) == EAGLE3
    assert worker["extraPodSpec"]["volumes"] == [
        {"name": "engine-config", "configMap": {"name": cm["metadata"]["name"]}}
    ]


def test_disaggregated_graph_has_prefill_and_decode_workers() -> None:
    cm, dgd = graph("s", "baseline", BASELINE, opts(disaggregated=True, prefill_replicas=2))
    assert schema_errors(dgd) == []
    services = dgd["spec"]["services"]
    prefill, decode = services["TRTLLMPrefillWorker"], services["TRTLLMDecodeWorker"]
    assert (prefill["subComponentType"], prefill["replicas"]) == ("prefill", 2)
    assert (decode["subComponentType"], decode["replicas"]) == ("decode", 1)
    assert prefill["extraPodSpec"]["mainContainer"]["args"][-3:] == [
        f"{CONFIG_DIR}/prefill.yaml", "--disaggregation-mode", "prefill",
    ]  # fmt: skip
    assert decode["extraPodSpec"]["mainContainer"]["args"][-3:] == [
        f"{CONFIG_DIR}/decode.yaml", "--disaggregation-mode", "decode",
    ]  # fmt: skip
    pre, dec = (yaml.safe_load(cm["data"][f]) for f in ("prefill.yaml", "decode.yaml"))
    assert pre == {**BASELINE, "cache_transceiver_config": {"backend": "DEFAULT"},
                   "disable_overlap_scheduler": True}  # fmt: skip
    assert dec == {**BASELINE, "cache_transceiver_config": {"backend": "DEFAULT"}}
    assert "cache_transceiver_config" not in BASELINE  # the caller's dict is left alone


def test_ranks_beyond_a_node_make_a_multinode_worker() -> None:
    big = {**BASELINE, "tensor_parallel_size": 8, "pipeline_parallel_size": 2}
    _, dgd = graph("s", "baseline", big, opts(gpus_per_node=8))
    assert schema_errors(dgd) == []
    worker = dgd["spec"]["services"]["TRTLLMWorker"]
    assert worker["multinode"] == {"nodeCount": 2}
    assert worker["resources"]["limits"] == {"gpu": "8"}  # per node
    with pytest.raises(DeployError) as err:
        graph("s", "baseline", {"tensor_parallel_size": 12}, opts(gpus_per_node=8))
    assert (err.value.message, err.value.hint) == (
        "baseline: TP×PP = 12 ranks cannot be split into nodes of 8 GPUs",
        "use nodes whose GPU count divides TP×PP, or change the engine config",
    )


def test_bad_configs_are_refused() -> None:
    with pytest.raises(DeployError) as err:
        graph("s", "v", {"tensor_parallel_size": "eight"}, opts())
    assert err.value.message == (
        "variant v: tensor_parallel_size / pipeline_parallel_size must be integers"
    )
    with pytest.raises(DeployError) as err:
        graph("s", "v", ["not", "a", "mapping"], opts())  # type: ignore[arg-type]
    assert err.value.message == "variant v: the engine config is not a mapping"
    with pytest.raises(DeployError) as err:
        graphs("s", {}, opts())
    assert err.value.message == "no variant engine configs given"
    assert k8s_name("Qwen2.5_7B", "draft.int8") == "qwen2-5-7b-draft-int8"


def test_cli_writes_one_graph_per_variant(tmp_path: Path) -> None:
    for name, cfg in (("baseline", BASELINE), ("eagle3", EAGLE3)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "dynamo"
    res = CliRunner().invoke(
        cli,
        ["deploy", "dynamo", "--spec-name", "llama-70b", "--model", MODEL, "--image", IMAGE,
         "--engine-config", f"baseline={tmp_path / 'baseline.yaml'}",
         "--engine-config", f"eagle3={tmp_path / 'eagle3.yaml'}",
         "--disaggregated", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == [
        "baseline.yaml", "eagle3.yaml", "trtspec-deploy.json",
    ]  # fmt: skip
    for variant in ("baseline", "eagle3"):
        docs = list(yaml.safe_load_all((out / f"{variant}.yaml").read_text()))
        assert [d["kind"] for d in docs] == ["ConfigMap", "DynamoGraphDeployment"]
        assert all(schema_errors(d) == [] for d in docs)
    bad = CliRunner().invoke(
        cli,
        ["deploy", "dynamo", "--spec-name", "x", "--model", MODEL, "--image", IMAGE,
         "--engine-config", "no-equals-sign", "--out", str(tmp_path / "o2")],
    )  # fmt: skip
    assert bad.exit_code == 2
    assert "'no-equals-sign': write VARIANT=FILE" in bad.stderr
    assert not (tmp_path / "o2").exists()


LLMAPI_SPEC = """\
name: dyn
flow: llmapi
target: {model: meta-llama/Llama-3.1-8B-Instruct, family: llama, max_batch_size: 8,
         max_input_len: 1024, max_seq_len: 2048}
variants:
  - {name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 3}
  - {name: eagle3, mode: eagle, checkpoint: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B,
     num_eagle_layers: 3, eagle_choices: [[0], [0, 0], [0, 0, 0]]}
"""


def test_an_llmapi_spec_gives_one_valid_graph_per_variant(tmp_path: Path) -> None:
    """`--spec` of an LLM-API spec: the configs the flow generates (checked
    against the pinned llm_args table), each with the whole KV fraction, one
    graph per variant that passes the pinned CRD schema."""
    spec = tmp_path / "dyn.yaml"
    spec.write_text(LLMAPI_SPEC)
    out = tmp_path / "dynamo"
    res = CliRunner().invoke(
        cli,
        ["deploy", "dynamo", "--spec", str(spec), "--image", IMAGE, "--out", str(out),
         "--engines", str(tmp_path / "engines")],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    for variant, decoding in (("baseline", None), ("ngram", "NGram"), ("eagle3", "Eagle3")):
        docs = list(yaml.safe_load_all((out / f"{variant}.yaml").read_text()))
        assert all(schema_errors(d) == [] for d in docs)
        assert docs[1]["metadata"]["name"].startswith("dyn-")
        engine = yaml.safe_load(next(iter(docs[0]["data"].values())))
        assert engine["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
        assert engine["model"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert (engine.get("speculative_config") or {}).get("decoding_type") == decoding
    engine_flow = tmp_path / "engine.yaml"
    engine_flow.write_text(LLMAPI_SPEC.replace("flow: llmapi\n", ""))
    bad = CliRunner().invoke(
        cli, ["deploy", "dynamo", "--spec", str(engine_flow), "--image", IMAGE,
              "--out", str(tmp_path / "o3")],
    )  # fmt: skip
    assert bad.exit_code == 1
    assert "uses the engine flow; Dynamo's TensorRT-LLM workers run the LLM-API flow" in bad.stderr
    assert not (tmp_path / "o3").exists()
    none = CliRunner().invoke(cli, ["deploy", "dynamo", "--image", IMAGE, "--out", str(out)])
    assert none.exit_code == 2
    assert "give an LLM-API spec (--spec)" in none.stderr
