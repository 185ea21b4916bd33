"""Regenerate the trimmed schemas in this folder from their pinned sources
(see README.md here). Not run by the tests: they read its output.

    python tests/data/deploy_schemas/trim.py \
        --k8s-dir <wheel>/kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict \
        --lws-crd leaderworkerset.x-k8s.io_leaderworkersets.yaml \
        --servicemonitor-crd monitoring.coreos.com_servicemonitors.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
# The kinds `trtspec deploy` writes (and the Dynamo schema's embedded core types).
K8S_KINDS = (
    "configmap-v1",
    "deployment-apps-v1",
    "horizontalpodautoscaler-autoscaling-v2",
    "job-batch-v1",
    "persistentvolumeclaim-v1",
    "poddisruptionbudget-policy-v1",
    "role-rbac-v1",
    "rolebinding-rbac-v1",
    "secret-v1",
    "service-v1",
    "serviceaccount-v1",
)
EXTRA_DEFS = ("io.k8s.api.core.v1.PodTemplateSpec", "io.k8s.api.core.v1.PodSpec")
DEFS_ID = "https://kubernetes.io/api/_definitions.json"


def _refs(node: Any) -> list[str]:
    out: list[str] = []
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and "#/$defs/" in ref:
            out.append(ref.rsplit("/", 1)[-1])
        for value in node.values():
            out += _refs(value)
    elif isinstance(node, list):
        for value in node:
            out += _refs(value)
    return out


def trim_k8s(k8s_dir: Path) -> None:
    defs = json.loads((k8s_dir / "_definitions.json").read_text())["$defs"]
    kinds = {k: json.loads((k8s_dir / f"{k}.json").read_text()) for k in K8S_KINDS}
    keep: set[str] = set()
    pending = [r for schema in kinds.values() for r in _refs(schema)] + list(EXTRA_DEFS)
    while pending:
        name = pending.pop()
        if name not in keep:
            keep.add(name)
            pending += _refs(defs[name])
    out = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": DEFS_ID,
        "$defs": {k: defs[k] for k in sorted(keep)},
    }
    (HERE / "k8s-v1.33.0").mkdir(exist_ok=True)
    (HERE / "k8s-v1.33.0" / "_definitions.json").write_text(json.dumps(out, indent=1) + "\n")
    for name, schema in kinds.items():
        (HERE / "k8s-v1.33.0" / f"{name}.json").write_text(json.dumps(schema, indent=1) + "\n")


def strict(node: Any) -> Any:
    """A CRD's structural schema as JSON Schema that refuses unknown fields
    (what `kubectl apply --validate=strict`, the default, does on the server)."""
    if isinstance(node, list):
        return [strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {
        k: strict(v)
        for k, v in node.items()
        if k not in ("description",) and not k.startswith("x-kubernetes-validations")
    }
    if "properties" in node:
        out["properties"] = {k: strict(v) for k, v in node["properties"].items()}
    if (
        node.get("type") == "object"
        and "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def crd_schema(path: Path, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(path.read_text())
    ver = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return ver["schema"]["openAPIV3Schema"]


def trim_lws(path: Path) -> None:
    schema = strict(crd_schema(path, "v1"))
    tmpl = schema["properties"]["spec"]["properties"]["leaderWorkerTemplate"]["properties"]
    ref = {"$ref": f"{DEFS_ID}#/$defs/io.k8s.api.core.v1.PodTemplateSpec"}
    for name in ("leaderTemplate", "workerTemplate"):
        tmpl[name] = ref  # the CRD inlines core/v1 PodTemplateSpec here
    schema["properties"]["status"] = {"type": "object"}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    (HERE / "leaderworkerset-v1-lws-v0.10.0.json").write_text(json.dumps(schema, indent=1) + "\n")


def trim_servicemonitor(path: Path) -> None:
    schema = strict(crd_schema(path, "v1"))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out = HERE / "servicemonitor-v1-prometheus-operator-v0.93.0.json"
    out.write_text(json.dumps(schema, indent=1) + "\n")


# The DynamoGraphDeployment CRD (v1alpha1) of ai-dynamo/dynamo at commit
# 967e177cc5754a5c26c038744fd02f435600954c, file
# deploy/cloud/operator/config/crd/bases/nvidia.com_dynamographdeployments.yaml
# (777,521 characters: too large to keep). Transcribed field by field: every
# field of spec and of a service with its type and constraints; the core types
# it inlines (EnvVar, Probe, PodSpec, Container) point at the pinned Kubernetes
# definitions instead (extraPodSpec = PodSpec without `required` plus
# mainContainer, as its description says); the deprecated `autoscaling` block
# and `status` are left open.
_STR = {"type": "string"}
_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_QTY = {"anyOf": [{"type": "integer"}, {"type": "string"}]}


def _k8s(name: str) -> dict[str, Any]:
    return {"$ref": f"{DEFS_ID}#/$defs/io.k8s.api.core.v1.{name}"}


def _closed(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def _dgd_resources() -> dict[str, Any]:
    amount = _closed({"cpu": _STR, "custom": _MAP, "gpu": _STR, "gpuType": _STR, "memory": _STR})
    claim = _closed({"name": _STR, "request": _STR}, ("name",))
    return _closed(
        {"claims": {"type": "array", "items": claim}, "limits": amount, "requests": amount}
    )


def strict_refs(node: Any) -> Any:
    """``node`` without descriptions (the copy only needs the structure)."""
    if isinstance(node, list):
        return [strict_refs(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_refs(v) for k, v in node.items() if k != "description"}
    if "properties" in node:
        out["properties"] = {k: strict_refs(v) for k, v in node["properties"].items()}
    return out


def dgd_schema(k8s_defs: dict[str, Any]) -> dict[str, Any]:
    # a copy, its references made absolute (they point into _definitions.json)
    text = json.dumps(k8s_defs["io.k8s.api.core.v1.PodSpec"])
    pod_spec = strict_refs(json.loads(text.replace('"#/$defs/', f'"{DEFS_ID}#/$defs/')))
    pod_spec.pop("required", None)
    pod_spec["properties"]["mainContainer"] = _k8s("Container")
    ingress = _closed(
        {
            "annotations": _MAP,
            "enabled": {"type": "boolean"},
            "host": _STR,
            "hostPrefix": _STR,
            "hostSuffix": _STR,
            "ingressControllerClassName": _STR,
            "labels": _MAP,
            "tls": _closed({"secretName": _STR}),
            "useVirtualService": {"type": "boolean"},
            "virtualServiceGateway": _STR,
        }
    )
    service = _closed(
        {
            "annotations": _MAP,
            "autoscaling": {"type": "object"},
            "componentType": _STR,
            "dynamoNamespace": _STR,
            "envFromSecret": _STR,
            "envs": {"type": "array", "items": _k8s("EnvVar")},
            "extraPodMetadata": _closed({"annotations": _MAP, "labels": _MAP}),
            "extraPodSpec": pod_spec,
            "globalDynamoNamespace": {"type": "boolean"},
            "ingress": ingress,
            "labels": _MAP,
            "livenessProbe": _k8s("Probe"),
            "modelRef": _closed({"name": _STR, "revision": _STR}, ("name",)),
            "multinode": _closed(
                {"nodeCount": {"type": "integer", "minimum": 2, "default": 2}}, ("nodeCount",)
            ),
            "readinessProbe": _k8s("Probe"),
            "replicas": {"type": "integer"},
            "resources": _dgd_resources(),
            "serviceName": _STR,
            "sharedMemory": _closed({"disabled": {"type": "boolean"}, "size": _QTY}),
            "subComponentType": _STR,
            "volumeMounts": {
                "type": "array",
                "items": _closed(
                    {
                        "mountPoint": _STR,
                        "name": _STR,
                        "useAsCompilationCache": {"type": "boolean"},
                    },
                    ("name",),
                ),
            },
        }
    )
    pvc = _closed(
        {
            "create": {"type": "boolean"},
            "name": _STR,
            "size": _QTY,
            "storageClass": _STR,
            "volumeAccessMode": _STR,
        },
        ("name",),
    )
    spec = _closed(
        {
            "backendFramework": {"type": "string", "enum": ["sglang", "vllm", "trtllm"]},
            "envs": {"type": "array", "items": _k8s("EnvVar")},
            "pvcs": {"type": "array", "items": pvc, "maxItems": 100},
            "services": {"type": "object", "additionalProperties": service, "maxProperties": 25},
        }
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "apiVersion": {"const": "nvidia.com/v1alpha1"},
            "kind": {"const": "DynamoGraphDeployment"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": {"type": "object"},
        },
        "additionalProperties": False,
    }


def write_dgd() -> None:
    defs = json.loads((HERE / "k8s-v1.33.0" / "_definitions.json").read_text())["$defs"]
    out = HERE / "dynamographdeployment-v1alpha1-dynamo-967e177.json"
    out.write_text(json.dumps(dgd_schema(defs), indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k8s-dir", type=Path, help="regenerate the Kubernetes kinds")
    parser.add_argument("--lws-crd", type=Path)
    parser.add_argument("--servicemonitor-crd", type=Path)
    args = parser.parse_args()
    if args.k8s_dir:
        trim_k8s(args.k8s_dir)
    if args.lws_crd:
        trim_lws(args.lws_crd)
    if args.servicemonitor_crd:
        trim_servicemonitor(args.servicemonitor_crd)
    write_dgd()


if __name__ == "__main__":
    main()
