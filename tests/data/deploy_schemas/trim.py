"""Regenerate the trimmed schemas in this folder from their pinned sources
(see README.md here). Not run by the tests: they read its output.

    python tests/data/deploy_schemas/trim.py \
        --k8s-dir <wheel>/kubernetes_validate/kubernetes-json-schema/v1.33.0-local-strict \
        --lws-crd leaderworkerset.x-k8s.io_leaderworkersets.yaml \
        --servicemonitor-crd monitoring.coreos.com_servicemonitors.yaml \
        --httproute-crd gateway.networking.k8s.io_httproutes.yaml
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


def trim_httproute(path: Path) -> None:
    schema = strict(crd_schema(path, "v1"))
    schema["properties"]["status"] = {"type": "object"}
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out = HERE / "httproute-v1-gateway-api-v1.3.0.json"
    out.write_text(json.dumps(schema, indent=1) + "\n")


def trim_servicemonitor(path: Path) -> None:
    schema = strict(crd_schema(path, "v1"))
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out = HERE / "servicemonitor-v1-prometheus-operator-v0.93.0.json"
    out.write_text(json.dumps(schema, indent=1) + "\n")


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


# The DynamoGraphDeployment CRD, version v1beta1 (the storage version from
# Dynamo 1.5.0), transcribed from its Go API types in ai-dynamo/dynamo
# deploy/operator/api/v1beta1/: dynamographdeployment_types.go @
# 0fddc01b37244c4cfa5bcfd1c2e4f1a577ee833c (DynamoGraphDeploymentSpec) and
# dynamocomponentdeployment_types.go @ 006b6e1085b60436ba0f77378749ec3a0f01fc24
# (DynamoComponentDeploymentSharedSpec, MultinodeSpec, ModelReference).
# Every field of spec and of a component, with its type and kubebuilder
# constraints; podTemplate is core/v1 PodTemplateSpec (the pinned Kubernetes
# definition); the nested preview blocks (providerOverride, roles,
# experimental, restart, topologyConstraint, eppConfig, scalingAdapter,
# compilationCache) are objects left open, as is status.
DGD_BETA_COMMIT = "0fddc01b37244c4cfa5bcfd1c2e4f1a577ee833c"
COMPONENT_TYPES = ("planner", "frontend", "worker", "prefill", "decode", "epp", "default")


def dgd_beta_schema() -> dict[str, Any]:
    name = {"type": "string", "minLength": 1, "maxLength": 63,
            "pattern": "^[A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?$"}  # fmt: skip
    open_obj = {"type": "object"}
    component = _closed(
        {
            "providerOverride": open_obj,
            "name": name,
            "type": {"type": "string", "enum": list(COMPONENT_TYPES)},
            "runtimeVersionOverride": {
                "type": "string",
                "pattern": r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$",
            },
            "globalDynamoNamespace": {"type": "boolean"},
            "podTemplate": _k8s("PodTemplateSpec"),
            "replicas": {"type": "integer", "minimum": 0},
            "minAvailable": {"type": "integer", "minimum": 1},
            "multinode": _closed({"nodeCount": {"type": "integer", "minimum": 2, "default": 2}}),
            "roles": {"type": "array", "items": open_obj},
            "sharedMemorySize": _QTY,
            "modelRef": _closed(
                {"name": {"type": "string", "minLength": 1}, "revision": _STR}, ("name",)
            ),
            "scalingAdapter": open_obj,
            "eppConfig": open_obj,
            "frontendSidecar": _STR,
            "dynamoSidecar": _STR,
            "compilationCache": open_obj,
            "topologyConstraint": open_obj,
            "experimental": open_obj,
        },
        ("name",),
    )
    spec = _closed(
        {
            "providerOverride": open_obj,
            "annotations": _MAP,
            "labels": _MAP,
            "priorityClassName": _STR,
            "components": {"type": "array", "items": component, "maxItems": 25},
            "env": {"type": "array", "items": _k8s("EnvVar")},
            "backendFramework": {"type": "string", "enum": ["sglang", "vllm", "trtllm"]},
            "restart": open_obj,
            "topologyConstraint": open_obj,
            "experimental": open_obj,
        }
    )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {
            "apiVersion": {"const": "nvidia.com/v1beta1"},
            "kind": {"const": "DynamoGraphDeployment"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": {"type": "object"},
        },
        "additionalProperties": False,
    }


def write_dgd() -> None:
    out = HERE / f"dynamographdeployment-v1beta1-dynamo-{DGD_BETA_COMMIT[:7]}.json"
    out.write_text(json.dumps(dgd_beta_schema(), indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k8s-dir", type=Path, help="regenerate the Kubernetes kinds")
    parser.add_argument("--lws-crd", type=Path)
    parser.add_argument("--servicemonitor-crd", type=Path)
    parser.add_argument("--httproute-crd", type=Path)
    args = parser.parse_args()
    if args.httproute_crd:
        trim_httproute(args.httproute_crd)
    if args.k8s_dir:
        trim_k8s(args.k8s_dir)
    if args.lws_crd:
        trim_lws(args.lws_crd)
    if args.servicemonitor_crd:
        trim_servicemonitor(args.servicemonitor_crd)
    write_dgd()


if __name__ == "__main__":
    main()
