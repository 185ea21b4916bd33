"""NVIDIA Dynamo graphs for the LLM-API flow: one ``DynamoGraphDeployment``
per variant (each promoted variant and the baseline), built from that
variant's LLM-API engine config (the ``extra_llm_api_options`` dict trtspec
writes per variant: ``tensor_parallel_size``, ``speculative_config``,
``kv_cache_config`` ...), aggregated or disaggregated (prefill and decode
workers).

The graph follows the ``nvidia.com/v1alpha1`` CRD of ai-dynamo/dynamo at
commit ``967e177`` (``deploy/cloud/operator/config/crd/bases/
nvidia.com_dynamographdeployments.yaml``; the schema the tests validate
against): ``spec.backendFramework: trtllm`` and ``spec.services`` with a
``Frontend`` (``python3 -m dynamo.frontend``) and ``dynamo.trtllm`` workers
started with ``--model-path``, ``--served-model-name`` and
``--extra-engine-args`` pointing at the engine config, mounted from a
ConfigMap; ``--disaggregation-mode prefill|decode`` for the disaggregated
workers (as Dynamo's own trtllm templates do). Each variant is served under
its own model name, ``<spec>-<variant>``: Dynamo's frontend routes by model
name (and, within one model, by KV-cache overlap), so trtspec's per-route
decision becomes a choice of model name by the caller or a gateway
(docs/guide/deploy.md). No Click here.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import yaml

from trtspec.deploy.sizing import DeployError

DGD_API = "nvidia.com/v1alpha1"
CRD_SOURCE = (
    "ai-dynamo/dynamo deploy/cloud/operator/config/crd/bases/"
    "nvidia.com_dynamographdeployments.yaml @ 967e177cc5754a5c26c038744fd02f435600954c"
)
CONFIG_DIR = "/etc/trtspec/engine"
_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass
class DynamoOptions:
    image: (
        str  # a Dynamo TensorRT-LLM runtime image (nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:…)
    )
    model: str  # --model-path: a Hub id or a path inside the image / a mounted volume
    namespace: str = "default"
    gpus_per_node: int = 8
    replicas: int = 1
    disaggregated: bool = False
    prefill_replicas: int = 1
    secret: str | None = None  # envFromSecret, e.g. an HF token


def k8s_name(*parts: str) -> str:
    """A DNS-1123 name from ``parts`` (lower case, dashes, at most 63 characters)."""
    name = _NAME.sub("-", "-".join(parts).lower()).strip("-")
    return name[:63].rstrip("-")


def world_size(config: dict[str, Any], where: str) -> int:
    """TP×PP of an LLM-API engine config (both default to 1)."""
    try:
        tp = int(config.get("tensor_parallel_size", 1))
        pp = int(config.get("pipeline_parallel_size", 1))
    except (TypeError, ValueError):
        raise DeployError(
            f"{where}: tensor_parallel_size / pipeline_parallel_size must be integers",
            "fix the engine config trtspec generated for this variant",
        ) from None
    if tp < 1 or pp < 1:
        raise DeployError(f"{where}: TP and PP must be at least 1", "fix the engine config")
    return tp * pp


def _worker(
    *,
    name: str,
    served_name: str,
    config_map: str,
    config_file: str,
    world: int,
    opts: DynamoOptions,
    replicas: int,
    mode: str | None,
) -> dict[str, Any]:
    gpus = min(world, opts.gpus_per_node)
    args = [
        "--model-path", opts.model,
        "--served-model-name", served_name,
        "--extra-engine-args", f"{CONFIG_DIR}/{config_file}",
    ]  # fmt: skip
    if mode is not None:
        args += ["--disaggregation-mode", mode]
    service: dict[str, Any] = {
        "componentType": "worker",
        "replicas": replicas,
        "resources": {"limits": {"gpu": str(gpus)}, "requests": {"gpu": str(gpus)}},
        "extraPodSpec": {
            "mainContainer": {
                "name": "main",
                "image": opts.image,
                "command": ["python3", "-m", "dynamo.trtllm"],
                "args": args,
                "volumeMounts": [{"name": "engine-config", "mountPath": CONFIG_DIR}],
            },
            "volumes": [{"name": "engine-config", "configMap": {"name": config_map}}],
        },
    }
    if mode is not None:
        service["subComponentType"] = mode
    if world > opts.gpus_per_node:
        if world % opts.gpus_per_node:
            raise DeployError(
                f"{name}: TP×PP = {world} ranks cannot be split into nodes of "
                f"{opts.gpus_per_node} GPUs",
                "use nodes whose GPU count divides TP×PP, or change the engine config",
            )
        service["multinode"] = {"nodeCount": world // opts.gpus_per_node}
    if opts.secret:
        service["envFromSecret"] = opts.secret
    return service


def _disagg_configs(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prefill and decode configs: KV blocks move between them through the
    cache transceiver; the prefill worker runs without the overlap scheduler
    (both as Dynamo's trtllm disaggregated engine configs set them)."""
    prefill, decode = copy.deepcopy(config), copy.deepcopy(config)
    for c in (prefill, decode):
        c.setdefault("cache_transceiver_config", {"backend": "DEFAULT"})
    prefill.setdefault("disable_overlap_scheduler", True)
    return prefill, decode


def graph(
    spec_name: str, variant: str, config: dict[str, Any], opts: DynamoOptions
) -> list[dict[str, Any]]:
    """One variant's ``DynamoGraphDeployment`` and the ConfigMap of its engine config(s)."""
    if not isinstance(config, dict):
        raise DeployError(
            f"variant {variant}: the engine config is not a mapping",
            "pass the LLM-API options YAML trtspec generated for the variant",
        )
    if not opts.image:
        raise DeployError(
            "no Dynamo runtime image given",
            "pass --image nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:<release>",
        )
    name = k8s_name(spec_name, variant)
    config_map = k8s_name(name, "engine-config")
    world = world_size(config, f"variant {variant}")
    frontend = {
        "componentType": "frontend",
        "replicas": 1,
        "extraPodSpec": {
            "mainContainer": {
                "name": "main",
                "image": opts.image,
                "command": ["python3", "-m", "dynamo.frontend"],
                "args": ["--http-port", "8000"],
            }
        },
    }

    def worker(label: str, config_file: str, replicas: int, mode: str | None) -> dict[str, Any]:
        return _worker(
            name=label, served_name=name, config_map=config_map, config_file=config_file,
            world=world, opts=opts, replicas=replicas, mode=mode,
        )  # fmt: skip

    data: dict[str, str]
    if opts.disaggregated:
        prefill, decode = _disagg_configs(config)
        data = {
            "prefill.yaml": yaml.safe_dump(prefill, sort_keys=True),
            "decode.yaml": yaml.safe_dump(decode, sort_keys=True),
        }
        workers = {
            "TRTLLMPrefillWorker": worker(
                f"{variant}/prefill", "prefill.yaml", opts.prefill_replicas, "prefill"
            ),
            "TRTLLMDecodeWorker": worker(
                f"{variant}/decode", "decode.yaml", opts.replicas, "decode"
            ),
        }
    else:
        data = {"engine.yaml": yaml.safe_dump(config, sort_keys=True)}
        workers = {"TRTLLMWorker": worker(variant, "engine.yaml", opts.replicas, None)}
    labels = {
        "app.kubernetes.io/name": "trtspec",
        "app.kubernetes.io/instance": name,
        "trtspec.dev/variant": variant,
    }
    dgd = {
        "apiVersion": DGD_API,
        "kind": "DynamoGraphDeployment",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": labels,
            "annotations": {"trtspec.dev/spec": spec_name, "trtspec.dev/crd": CRD_SOURCE},
        },
        "spec": {
            "backendFramework": "trtllm",
            "services": {"Frontend": frontend, **workers},
        },
    }
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map, "namespace": opts.namespace, "labels": labels},
        "data": data,
    }
    return [cm, dgd]


def graphs(
    spec_name: str, configs: dict[str, dict[str, Any]], opts: DynamoOptions
) -> dict[str, list[dict[str, Any]]]:
    """One file's resources per variant: ``{variant: [ConfigMap, DynamoGraphDeployment]}``."""
    if not configs:
        raise DeployError(
            "no variant engine configs given",
            "pass --engine-config VARIANT=FILE once per variant (the baseline included)",
        )
    return {variant: graph(spec_name, variant, cfg, opts) for variant, cfg in configs.items()}
