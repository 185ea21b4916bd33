"""NVIDIA Dynamo graphs for the LLM-API flow: one ``DynamoGraphDeployment``
per variant the benchmark promoted (and the baseline), built from that
variant's LLM-API engine config (the ``extra_llm_api_options`` dict trtspec
writes per variant: ``tensor_parallel_size``, ``speculative_config``,
``kv_cache_config`` ...), aggregated or disaggregated (prefill and decode
workers).

Pinned to the Dynamo 1.4.2 release, which pairs with the LLM-API flow's
TensorRT-LLM pin: its PyPI wheel ``ai-dynamo`` 1.4.2 pins
``tensorrt-llm==1.3.0rc22`` and makes ``nvidia.com/v1beta1`` graphs
(``spec.components[]``; its profiler's DGD types), the form this module
writes: ``name``, ``type`` (frontend, worker, prefill, decode), ``replicas``
and a ``podTemplate`` whose ``main`` container runs ``python3 -m
dynamo.frontend`` or ``python3 -m dynamo.trtllm --model-path …
--served-model-name … --extra-engine-args … [--disaggregation-mode
prefill|decode]``, on ``nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:1.4.2``.
The same form is in the next release's own trtllm graph templates (1.5.1,
kept in tests/data/deploy_schemas/dynamo-1.5.1/). The schema the tests
validate against is transcribed from the v1beta1 Go API types (commit
0fddc01, tests/data/deploy_schemas/README.md). A spec pinned to another
TensorRT-LLM is refused: its configs were checked against another field table.

Each variant is served under its own model name, ``<spec>-<variant>``:
Dynamo's frontend routes by model name, so trtspec's per-route decision
becomes a choice of model name by the caller or a gateway (docs/guide/deploy.md).
Names stay within Grove's 45 characters for the pod names it derives
(DGD name + component name, + the PodClique name for multi-node; a cut name
gets a hash suffix so two cut names cannot collide). No Click here.
"""

from __future__ import annotations

import copy
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trtspec.deploy.sizing import DeployError

DGD_API = "nvidia.com/v1beta1"
DYNAMO_RELEASE = "1.4.2"
DYNAMO_TRTLLM = "1.3.0rc22"  # ai-dynamo 1.4.2's METADATA: tensorrt-llm==1.3.0rc22
RUNTIME_IMAGE = f"nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:{DYNAMO_RELEASE}"
CRD_SOURCE = (
    "ai-dynamo/dynamo deploy/operator/api/v1beta1 (DynamoGraphDeployment types) "
    "@ 0fddc01b37244c4cfa5bcfd1c2e4f1a577ee833c; release ai-dynamo 1.4.2"
)
CONFIG_DIR = "/etc/trtspec/engine"
MODELS_DIR = "/models"
# Grove names a pod <PodCliqueSet>-<PodClique>-<random> (multi-node:
# <PCS>-<scaling group>-<PodClique>-…) and refuses a sum of names above 45
# (Dynamo's maxCombinedResourceNameLength; grove validatePodNameConstraints);
# a multi-node component's PodCliques are <component>-ldr and <component>-wkr
# (consts GroveRoleSuffixLeader/Worker).
GROVE_NAME_LIMIT = 45
MULTINODE_SUFFIX = "-ldr"
# The speculative modes Dynamo's own disaggregated TensorRT-LLM configs use
# (ai-dynamo/dynamo examples/backends/trtllm/engine_configs @ b6f88b1f:
# deepseek-r1/disagg/mtp (MTP), llama4/eagle (decoding_type Eagle with
# eagle3_one_model)); no draft-target or n-gram disaggregated config exists.
DISAGG_DECODING = ("MTP", "Eagle3", "Eagle")
DRAFT_KEYS = ("speculative_model_dir", "speculative_model")
_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass
class DynamoOptions:
    model: str  # --model-path: a Hub id, or a path under --model-root on --model-pvc
    image: str = RUNTIME_IMAGE
    namespace: str = "default"
    gpus_per_node: int = 8
    replicas: int = 1
    disaggregated: bool = False
    prefill_replicas: int = 1
    secret: str | None = None  # envFrom secretRef, e.g. an HF token
    model_pvc: str | None = None  # a claim holding the model folders
    model_root: str | None = None  # the folder on this machine the claim holds


def k8s_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 name from ``parts``, at most ``limit`` characters; a cut
    name ends in 4 hex digits of the whole name's hash, so two names cut to
    the same prefix still differ."""
    name = _NAME.sub("-", "-".join(parts).lower()).strip("-")
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:4]
    return f"{name[: limit - 5].rstrip('-')}-{digest}"


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


def _is_local(ref: str) -> bool:
    return ref.startswith(("/", "./", "../", "~")) or Path(ref).expanduser().exists()


def pod_model(ref: str, opts: DynamoOptions, where: str) -> str:
    """Where the pods find a model: a Hub id as it is; a folder on this
    machine under ``--model-root``, at the same place under ``/models`` on the
    ``--model-pvc`` claim. A builder's path never reaches a pod."""
    if not _is_local(ref):
        return ref
    if not opts.model_pvc:
        raise DeployError(
            f"{where}: {ref} is a folder on this machine, which the pods cannot see",
            "pass its Hugging Face id instead (--model, or the spec's model), or copy it onto a "
            "claim and pass --model-pvc CLAIM --model-root FOLDER-THE-CLAIM-HOLDS",
        )
    path = os.path.abspath(os.path.expanduser(ref))
    root = os.path.abspath(os.path.expanduser(opts.model_root or os.path.dirname(path)))
    if os.path.commonpath([root, path]) != root:
        raise DeployError(
            f"{where}: {ref} is not under --model-root {root}",
            "pass the --model-root the claim holds, which must contain every model folder",
        )
    rel = os.path.relpath(path, root)
    return MODELS_DIR if rel == "." else f"{MODELS_DIR}/{rel}"


def _decoding(config: dict[str, Any]) -> str | None:
    spec = config.get("speculative_config")
    return str(spec.get("decoding_type")) if isinstance(spec, dict) else None


def _disagg_configs(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Prefill and decode configs: KV blocks move between them through the
    cache transceiver; the prefill worker runs without the overlap scheduler
    (both as Dynamo's trtllm disaggregated engine configs set them)."""
    prefill, decode = copy.deepcopy(config), copy.deepcopy(config)
    for c in (prefill, decode):
        c.setdefault("cache_transceiver_config", {"backend": "DEFAULT"})
    prefill.setdefault("disable_overlap_scheduler", True)
    return prefill, decode


def _main(opts: DynamoOptions, command: list[str], args: list[str]) -> dict[str, Any]:
    main: dict[str, Any] = {"name": "main", "image": opts.image, "command": command,
                            "args": args}  # fmt: skip
    if opts.secret:
        main["envFrom"] = [{"secretRef": {"name": opts.secret}}]
    return main


def _worker(
    component: str, *, served_name: str, model: str, config_map: str, config_file: str,
    world: int, opts: DynamoOptions, replicas: int,
) -> dict[str, Any]:  # fmt: skip
    kind = component  # worker | prefill | decode: the component's name is its type
    gpus = min(world, opts.gpus_per_node)
    args = ["--model-path", model, "--served-model-name", served_name,
            "--extra-engine-args", f"{CONFIG_DIR}/{config_file}"]  # fmt: skip
    if kind in ("prefill", "decode"):
        args += ["--disaggregation-mode", kind]
    main = _main(opts, ["python3", "-m", "dynamo.trtllm"], args)
    main["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    mounts = [{"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True}]
    volumes: list[dict[str, Any]] = [{"name": "engine-config", "configMap": {"name": config_map}}]
    if opts.model_pvc:
        mounts.append({"name": "models", "mountPath": MODELS_DIR, "readOnly": True})
        volumes.append(
            {
                "name": "models",
                "persistentVolumeClaim": {"claimName": opts.model_pvc, "readOnly": True},
            }
        )
    main["volumeMounts"] = mounts
    out: dict[str, Any] = {
        "name": component,
        "type": kind,
        "replicas": replicas,
        "podTemplate": {"spec": {"containers": [main], "volumes": volumes}},
    }
    if world > opts.gpus_per_node:
        if world % opts.gpus_per_node:
            raise DeployError(
                f"{served_name}: TP×PP = {world} ranks cannot be split into nodes of "
                f"{opts.gpus_per_node} GPUs",
                "use nodes whose GPU count divides TP×PP, or change the engine config",
            )
        out["multinode"] = {"nodeCount": world // opts.gpus_per_node}
    return out


def graph_name(spec_name: str, variant: str, workers: list[str], multinode: bool) -> str:
    """The graph's name: ``<spec>-<variant>``, cut (with a hash suffix) so that
    Grove's names for its longest component fit its 45 characters: the
    component's name, or for a multi-node worker its scaling group (the
    component's name) and its longest PodClique (``<component>-ldr``)."""
    used = [len("frontend")] + [
        2 * len(c) + len(MULTINODE_SUFFIX) if multinode else len(c) for c in workers
    ]
    return k8s_name(spec_name, variant, limit=GROVE_NAME_LIMIT - max(used))


def graph(
    spec_name: str,
    variant: str,
    config: dict[str, Any],
    opts: DynamoOptions,
    *,
    max_concurrency: int | None = None,
) -> list[dict[str, Any]]:
    """One variant's ``DynamoGraphDeployment`` and the ConfigMap of its engine config(s)."""
    if not isinstance(config, dict):
        raise DeployError(
            f"variant {variant}: the engine config is not a mapping",
            "pass the LLM-API options YAML trtspec generated for the variant",
        )
    if not opts.image:
        raise DeployError("no Dynamo runtime image given", f"pass --image {RUNTIME_IMAGE}")
    config = copy.deepcopy(config)
    where = f"variant {variant}"
    world = world_size(config, where)
    decoding = _decoding(config)
    if opts.disaggregated and decoding is not None and decoding not in DISAGG_DECODING:
        raise DeployError(
            f"{where}: --disaggregated with speculative decoding_type {decoding}: Dynamo's "
            f"disaggregated TensorRT-LLM serving is shown upstream only for "
            f"{', '.join(DISAGG_DECODING[:2])}",
            "deploy this variant aggregated (leave out --disaggregated)",
        )
    for key in ("model", "tokenizer"):  # the LLM-API document names the model too
        if isinstance(config.get(key), str):
            config[key] = pod_model(config[key], opts, f"{where}: {key}")
    spec_cfg = config.get("speculative_config")
    if isinstance(spec_cfg, dict):
        for key in DRAFT_KEYS:
            if isinstance(spec_cfg.get(key), str):
                spec_cfg[key] = pod_model(spec_cfg[key], opts, f"{where}: speculative_config.{key}")
    if max_concurrency is not None:
        # the graph's workers schedule at most this many requests at once (the
        # route's spill point; beyond it requests wait here instead of moving)
        config["max_batch_size"] = min(int(config.get("max_batch_size") or max_concurrency),
                                       max_concurrency)  # fmt: skip
    model = pod_model(opts.model, opts, f"{where}: --model")
    kinds = ["prefill", "decode"] if opts.disaggregated else ["worker"]
    multinode = world > opts.gpus_per_node
    name = graph_name(spec_name, variant, kinds, multinode)
    served_name = k8s_name(spec_name, variant)
    config_map = k8s_name(name, "engine")
    data: dict[str, str]
    if opts.disaggregated:
        prefill, decode = _disagg_configs(config)
        data = {"prefill.yaml": yaml.safe_dump(prefill, sort_keys=True),
                "decode.yaml": yaml.safe_dump(decode, sort_keys=True)}  # fmt: skip

        def two(kind: str, replicas: int) -> dict[str, Any]:
            return _worker(kind, served_name=served_name, model=model, config_map=config_map,
                           config_file=f"{kind}.yaml", world=world, opts=opts,
                           replicas=replicas)  # fmt: skip

        workers = [two("prefill", opts.prefill_replicas), two("decode", opts.replicas)]
    else:
        data = {"engine.yaml": yaml.safe_dump(config, sort_keys=True)}
        workers = [
            _worker("worker", served_name=served_name, model=model, config_map=config_map,
                    config_file="engine.yaml", world=world, opts=opts, replicas=opts.replicas)
        ]  # fmt: skip
    frontend = {
        "name": "frontend",
        "type": "frontend",
        "replicas": 1,
        "podTemplate": {"spec": {"containers": [
            _main(opts, ["python3", "-m", "dynamo.frontend"], ["--http-port", "8000"])
        ]}},
    }  # fmt: skip
    labels = {
        "app.kubernetes.io/name": "trtspec",
        "app.kubernetes.io/instance": name,
        "trtspec.dev/variant": k8s_name(variant),
    }
    notes = {"trtspec.dev/spec": spec_name, "trtspec.dev/served-model-name": served_name,
             "trtspec.dev/crd": CRD_SOURCE, "trtspec.dev/dynamo-trtllm": DYNAMO_TRTLLM}  # fmt: skip
    if max_concurrency is not None:
        notes["trtspec.dev/max-concurrency"] = str(max_concurrency)
    dgd = {
        "apiVersion": DGD_API,
        "kind": "DynamoGraphDeployment",
        "metadata": {
            "name": name,
            "namespace": opts.namespace,
            "labels": labels,
            "annotations": notes,
        },
        "spec": {"backendFramework": "trtllm", "components": [frontend, *workers]},
    }
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": config_map, "namespace": opts.namespace, "labels": labels},
        "data": data,
    }
    return [cm, dgd]


def graphs(
    spec_name: str,
    configs: dict[str, dict[str, Any]],
    opts: DynamoOptions,
    *,
    max_concurrency: dict[str, int] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """One file's resources per variant: ``{variant: [ConfigMap, DynamoGraphDeployment]}``."""
    if not configs:
        raise DeployError(
            "no variant engine configs given",
            "pass --engine-config VARIANT=FILE once per variant (the baseline included)",
        )
    caps = max_concurrency or {}
    out = {
        variant: graph(spec_name, variant, cfg, opts, max_concurrency=caps.get(variant))
        for variant, cfg in configs.items()
    }
    names: dict[str, str] = {}
    for variant, docs in out.items():
        for doc in docs:
            key = f"{doc['kind']}/{doc['metadata']['name']}"
            if key in names:
                raise DeployError(
                    f"variants {names[key]} and {variant} both make {key}",
                    "rename one of the variants",
                )
            names[key] = variant
    return out


def promoted(table: Any, variants: list[str], where: str) -> tuple[list[str], dict[str, int]]:
    """The variants a routing table promotes on some route, after the baseline,
    and each one's ``max_concurrency`` (the smallest over its routes)."""
    from trtspec.catalogue import BASELINE

    rules = [r for r in table.routes.values() if r.decision == "promote" and r.variant != BASELINE]
    unknown = sorted({r.variant for r in rules} - set(variants))
    if unknown:
        raise DeployError(
            f"{where}: promotes {', '.join(unknown)}, which has no engine config here "
            f"(variants: {', '.join(variants)})",
            "deploy the spec the routing table was measured with",
        )
    chosen = sorted({r.variant for r in rules})
    caps: dict[str, int] = {}
    for r in rules:
        if r.max_concurrency is not None:
            caps[r.variant] = min(caps.get(r.variant, r.max_concurrency), r.max_concurrency)
    return [BASELINE, *chosen], caps


def check_trtllm(version: str, where: str) -> None:
    """The spec's LLM-API configs must be for the TensorRT-LLM the pinned
    Dynamo release runs (they were checked against that version's fields)."""
    if version != DYNAMO_TRTLLM:
        raise DeployError(
            f"{where}: flow.trtllm_version {version}, but Dynamo {DYNAMO_RELEASE}'s workers run "
            f"TensorRT-LLM {DYNAMO_TRTLLM}, whose LLM-API fields the configs must match",
            f"set flow.trtllm_version: {DYNAMO_TRTLLM} in the spec",
        )
