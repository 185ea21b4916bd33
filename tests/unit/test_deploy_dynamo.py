"""`trtspec deploy dynamo` / ``trtspec.deploy.dynamo``: v1beta1
DynamoGraphDeployments for the Dynamo 1.5.1 release, from hand-made LLM-API
engine configs and from an LLM-API spec's generated ones (``--spec``) for the
variants its routing table promotes; validated against the transcribed CRD
schema (dynamo 0fddc01), which also takes the release's own trtllm graphs
(tests/data/deploy_schemas/README.md); aggregated, disaggregated (MTP and
Eagle3 only) and multi-node; names within Grove's limit; models by Hub id
or a mounted claim; every refusal before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tests.fixtures.k8s_schemas import SCHEMAS, kubectl_apply_reads, schema_errors

from trtspec.cli.main import cli
from trtspec.deploy.dynamo import (
    CONFIG_DIR,
    DGD_API,
    RUNTIME_IMAGE,
    DynamoOptions,
    graph,
    graphs,
    k8s_name,
)
from trtspec.deploy.sizing import DeployError

IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.0.0-test"
UPSTREAM = SCHEMAS / "dynamo-1.5.1"  # the release's own trtllm graph templates
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


def components(dgd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in dgd["spec"]["components"]}


def main_container(component: dict[str, Any]) -> dict[str, Any]:
    (main,) = component["podTemplate"]["spec"]["containers"]
    assert main["name"] == "main"  # the container the operator merges its defaults into
    return main


def test_the_schema_refuses_a_misspelled_field_and_takes_upstreams_graphs() -> None:
    _, dgd = graph("spec", "baseline", BASELINE, opts())
    assert schema_errors(dgd) == []
    dgd["spec"]["components"][0]["typ"] = "frontend"
    dgd["spec"]["backendFramework"] = "tensorrt"
    assert schema_errors(dgd) == [
        "spec/backendFramework: 'tensorrt' is not one of ['sglang', 'vllm', 'trtllm']",
        "spec/components/0: Additional properties are not allowed ('typ' was unexpected)",
    ]
    # Dynamo's own trtllm graphs in this form (the 1.5.1 release's templates)
    # pass the transcribed schema
    for name in ("trtllm-agg.yaml", "trtllm-disagg.yaml"):
        (upstream,) = yaml.safe_load_all((UPSTREAM / name).read_text())
        assert upstream["apiVersion"] == DGD_API
        assert schema_errors(upstream) == [], name
        images = {main_container(c)["image"] for c in upstream["spec"]["components"]}
        assert images == {RUNTIME_IMAGE.replace(":1.4.2", ":1.5.1")}


def test_aggregated_graph_serves_the_variant_config() -> None:
    cm, dgd = graph("llama-70b", "eagle3", EAGLE3, opts(replicas=3, secret="hf-token"))
    assert schema_errors(dgd) == [] and schema_errors(cm) == []
    assert (dgd["apiVersion"], dgd["metadata"]["name"]) == (DGD_API, "llama-70b-eagle3")
    parts = components(dgd)
    assert sorted(parts) == ["frontend", "worker"]
    assert parts["frontend"]["type"] == "frontend"
    assert main_container(parts["frontend"])["command"] == ["python3", "-m", "dynamo.frontend"]
    worker = parts["worker"]
    assert (worker["type"], worker["replicas"]) == ("worker", 3)
    assert "multinode" not in worker
    main = main_container(worker)
    assert main["resources"] == {"limits": {"nvidia.com/gpu": "8"}}
    assert main["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert main["command"] == ["python3", "-m", "dynamo.trtllm"]
    assert main["args"] == [
        "--model-path", MODEL,
        "--served-model-name", "llama-70b-eagle3",
        "--extra-engine-args", f"{CONFIG_DIR}/engine.yaml",
    ]  # fmt: skip
    # the worker reads exactly the variant's config
    assert yaml.safe_load(cm["data"]["engine.yaml"]) == EAGLE3
    assert worker["podTemplate"]["spec"]["volumes"] == [
        {"name": "engine-config", "configMap": {"name": cm["metadata"]["name"]}}
    ]


def test_disaggregated_graph_has_prefill_and_decode_workers() -> None:
    cm, dgd = graph("s", "eagle3", EAGLE3, opts(disaggregated=True, prefill_replicas=2))
    assert schema_errors(dgd) == []
    parts = components(dgd)
    prefill, decode = parts["prefill"], parts["decode"]
    assert (prefill["type"], prefill["replicas"]) == ("prefill", 2)
    assert (decode["type"], decode["replicas"]) == ("decode", 1)
    assert main_container(prefill)["args"][-3:] == [
        f"{CONFIG_DIR}/prefill.yaml", "--disaggregation-mode", "prefill",
    ]  # fmt: skip
    assert main_container(decode)["args"][-3:] == [
        f"{CONFIG_DIR}/decode.yaml", "--disaggregation-mode", "decode",
    ]  # fmt: skip
    pre, dec = (yaml.safe_load(cm["data"][f]) for f in ("prefill.yaml", "decode.yaml"))
    assert pre == {**EAGLE3, "cache_transceiver_config": {"backend": "DEFAULT"},
                   "disable_overlap_scheduler": True}  # fmt: skip
    assert dec == {**EAGLE3, "cache_transceiver_config": {"backend": "DEFAULT"}}
    assert "cache_transceiver_config" not in EAGLE3  # the caller's dict is left alone
    # upstream disaggregates speculative decoding only for MTP and Eagle3
    ngram = {**BASELINE, "speculative_config": {"decoding_type": "NGram", "max_draft_len": 4}}
    with pytest.raises(DeployError) as err:
        graph("s", "ngram", ngram, opts(disaggregated=True))
    assert err.value.message == (
        "variant ngram: --disaggregated with speculative decoding_type NGram: Dynamo's "
        "disaggregated TensorRT-LLM serving is shown upstream only for MTP, Eagle3"
    )
    mtp = {**BASELINE, "speculative_config": {"decoding_type": "MTP", "max_draft_len": 3}}
    assert schema_errors(graph("s", "mtp", mtp, opts(disaggregated=True))[1]) == []


def test_ranks_beyond_a_node_make_a_multinode_worker() -> None:
    big = {**BASELINE, "tensor_parallel_size": 8, "pipeline_parallel_size": 2}
    _, dgd = graph("s", "baseline", big, opts(gpus_per_node=8))
    assert schema_errors(dgd) == []
    worker = components(dgd)["worker"]
    assert worker["multinode"] == {"nodeCount": 2}
    assert main_container(worker)["resources"]["limits"] == {"nvidia.com/gpu": "8"}  # per node
    with pytest.raises(DeployError) as err:
        graph("s", "baseline", {"tensor_parallel_size": 12}, opts(gpus_per_node=8))
    assert (err.value.message, err.value.hint) == (
        "s-baseline: TP×PP = 12 ranks cannot be split into nodes of 8 GPUs",
        "use nodes whose GPU count divides TP×PP, or change the engine config",
    )


def grove_lengths(dgd: dict[str, Any]) -> list[int]:
    """Grove's combined name per component, as Dynamo's admission computes it:
    the graph's name + the component's, + for a multi-node component its
    longest PodClique (<component>-ldr)."""
    name = dgd["metadata"]["name"]
    out = []
    for c in dgd["spec"]["components"]:
        extra = len(c["name"]) + 4 if "multinode" in c else 0
        out.append(len(name) + len(c["name"]) + extra)
    return out


def test_names_stay_within_groves_limit_and_never_collide() -> None:
    spec = "llama-3-1-70b-instruct-speculative"
    long_a, long_b = "eagle3-draft-len-3-tree-a", "eagle3-draft-len-3-tree-b"
    big = {**EAGLE3, "tensor_parallel_size": 16}
    made = graphs(spec, {long_a: big, long_b: big}, opts(disaggregated=True))
    names = [docs[1]["metadata"]["name"] for docs in made.values()]
    for docs in made.values():
        assert schema_errors(docs[1]) == []
        assert max(grove_lengths(docs[1])) <= 45, grove_lengths(docs[1])
    assert names[0] != names[1]  # cut to the same prefix, told apart by their hash
    assert names[0][:-5] == names[1][:-5]
    assert k8s_name("Qwen2.5_7B", "draft.int8") == "qwen2-5-7b-draft-int8"


def test_models_reach_the_pods_by_hub_id_or_a_mounted_claim(tmp_path: Path) -> None:
    local = tmp_path / "models" / "llama70b"
    draft = tmp_path / "models" / "eagle3"
    local.mkdir(parents=True)
    draft.mkdir()
    speculative = {**EAGLE3["speculative_config"], "speculative_model_dir": str(draft)}
    cfg = {**EAGLE3, "model": str(local), "speculative_config": speculative}
    with pytest.raises(DeployError) as err:
        graph("s", "eagle3", cfg, DynamoOptions(model=str(local)))
    assert err.value.message == (
        f"variant eagle3: model: {local} is a folder on this machine, which the pods cannot see"
    )
    claim = DynamoOptions(model=str(local), model_pvc="models", model_root=str(tmp_path / "models"))
    cm, dgd = graph("s", "eagle3", cfg, claim)
    assert schema_errors(dgd) == []
    main = main_container(components(dgd)["worker"])
    assert main["args"][1] == "/models/llama70b"
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in main["volumeMounts"]
    volumes = components(dgd)["worker"]["podTemplate"]["spec"]["volumes"]
    assert {
        "name": "models",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in volumes
    engine = yaml.safe_load(cm["data"]["engine.yaml"])
    assert (engine["model"], engine["speculative_config"]["speculative_model_dir"]) == (
        "/models/llama70b", "/models/eagle3",
    )  # fmt: skip
    assert str(tmp_path) not in yaml.safe_dump([cm, dgd])  # no builder path in the graph


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


def test_cli_writes_one_graph_per_variant(tmp_path: Path) -> None:
    for name, cfg in (("baseline", BASELINE), ("eagle3", EAGLE3)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "dynamo"
    res = CliRunner().invoke(
        cli,
        ["deploy", "dynamo", "--spec-name", "llama-70b", "--model", MODEL,
         "--engine-config", f"baseline={tmp_path / 'baseline.yaml'}",
         "--engine-config", f"eagle3={tmp_path / 'eagle3.yaml'}",
         "--disaggregated", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert sorted(kubectl_apply_reads(out)) == ["baseline.yaml", "eagle3.yaml"]
    for docs in kubectl_apply_reads(out).values():
        assert [d["kind"] for d in docs] == ["ConfigMap", "DynamoGraphDeployment"]
        assert all(schema_errors(d) == [] for d in docs)
        # the pinned release's runtime image by default
        assert {main_container(c)["image"] for c in docs[1]["spec"]["components"]} == {
            RUNTIME_IMAGE
        }
    summary = json.loads((out / "trtspec" / "deploy.json").read_text())
    assert (summary["dynamo_release"], summary["dynamo_tensorrt_llm"]) == ("1.4.2", "1.3.0rc22")
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
flow: {kind: llmapi, trtllm_version: 1.3.0rc22}
target: {model: meta-llama/Llama-3.1-8B-Instruct, family: llama, max_batch_size: 8,
         max_input_len: 1024, max_seq_len: 2048}
variants:
  - {name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 3}
  - {name: eagle3, mode: eagle, checkpoint: yuhuili/EAGLE3-LLaMA3.1-Instruct-8B,
     num_eagle_layers: 3, eagle_choices: [[0], [0, 0], [0, 0, 0]]}
"""


def test_an_llmapi_spec_gives_graphs_for_the_promoted_variants(tmp_path: Path) -> None:
    """`--spec` of an LLM-API spec with the benchmark's routing table: the
    configs the flow generates (checked against the pinned llm_args table),
    each with the whole KV fraction; graphs for the baseline and the variant a
    route promotes (not the excluded one), its max_concurrency carried."""
    spec = tmp_path / "dyn.yaml"
    spec.write_text(LLMAPI_SPEC)
    routing = tmp_path / "routing.yaml"
    routes = {
        "chat": {"variant": "eagle3", "decision": "promote", "max_concurrency": 8},
        "code": {"variant": "eagle3", "decision": "promote", "max_concurrency": 4},
        "rag": {"variant": "baseline", "decision": "exclude"},
    }
    table = {"schema_version": 1, "default_variant": "baseline", "routes": routes}
    routing.write_text(yaml.safe_dump(table))
    out = tmp_path / "dynamo"
    args = ["deploy", "dynamo", "--spec", str(spec), "--image", IMAGE,
            "--engines", str(tmp_path / "engines")]  # fmt: skip
    res = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert res.exit_code == 1 and not out.exists()
    assert "no routing table given, so which variants were promoted is unknown" in res.stderr
    res = CliRunner().invoke(cli, [*args, "--routing", str(routing), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(kubectl_apply_reads(out)) == ["baseline.yaml", "eagle3.yaml"]  # not ngram
    for variant, decoding in (("baseline", None), ("eagle3", "Eagle3")):
        docs = kubectl_apply_reads(out)[f"{variant}.yaml"]
        assert all(schema_errors(d) == [] for d in docs)
        assert docs[1]["metadata"]["name"] == f"dyn-{variant}"
        engine = yaml.safe_load(next(iter(docs[0]["data"].values())))
        assert engine["kv_cache_config"]["free_gpu_memory_fraction"] == 0.9
        assert engine["model"] == "meta-llama/Llama-3.1-8B-Instruct"
        assert (engine.get("speculative_config") or {}).get("decoding_type") == decoding
        if variant == "eagle3":  # the smaller of its routes' max_concurrency: 4
            assert engine["max_batch_size"] == 4
            assert docs[1]["metadata"]["annotations"]["trtspec.dev/max-concurrency"] == "4"
    res = CliRunner().invoke(cli, [*args, "--baseline-only", "--out", str(tmp_path / "b")])
    assert res.exit_code == 0, res.output
    assert sorted(kubectl_apply_reads(tmp_path / "b")) == ["baseline.yaml"]
    # configs checked against another TensorRT-LLM's fields are refused
    spec.write_text(LLMAPI_SPEC.replace("trtllm_version: 1.3.0rc22", "trtllm_version: 1.2.1"))
    res = CliRunner().invoke(cli, [*args, "--baseline-only", "--out", str(tmp_path / "c")])
    assert res.exit_code == 1 and not (tmp_path / "c").exists()
    assert res.stderr.splitlines()[-2:] == [
        f"Error: {spec}: flow.trtllm_version 1.2.1, but Dynamo 1.4.2's workers run "
        "TensorRT-LLM 1.3.0rc22, whose LLM-API fields the configs must match",
        "Hint: set flow.trtllm_version: 1.3.0rc22 in the spec",
    ]
    engine_flow = tmp_path / "engine.yaml"
    engine_flow.write_text(
        LLMAPI_SPEC.replace("flow: {kind: llmapi, trtllm_version: 1.3.0rc22}\n", "")
    )
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
