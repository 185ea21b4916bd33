"""Kubernetes manifests for the engine flow: what ``trtspec serve`` runs on one
machine, as a Deployment (or, when TP×PP exceeds one node's GPUs, a
LeaderWorkerSet whose leader starts the ranks with ``mpirun``), with a
Service, a ServiceMonitor, an optional HorizontalPodAutoscaler, the
restricted-API key from a Secret and, for multi-node, the RBAC and scripts
``mpirun`` needs to reach its group's pods.

The tritonserver command lines come from ``trtspec.serve`` (``server_argv``,
``leader_mode_argv``, ``orchestrator_mode_argv``; the same functions
``trtspec serve`` uses), so a pod runs exactly what a local server runs, bound
to 0.0.0.0 on the fixed ports 8000/8001/8002 and loading only the models the
routing table needs. Plain manifests, not a Helm chart: every value trtspec
decides (ranks, GPUs, load list, start-up budget, routing) comes from the
spec and the benchmark, so a template language would only re-expose them as
knobs that can disagree with the measurement; users who template anyway can
wrap the directory with kustomize. No Click here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trtspec.artifacts.routing import RoutingTable
from trtspec.catalogue import BASELINE
from trtspec.deploy import rollout_k8s
from trtspec.deploy.sizing import DeployError, Sizing
from trtspec.fsutil import make_staging_dir
from trtspec.runtime.heartbeat import DIR_ENV as HEARTBEAT_ENV
from trtspec.serve.access import ADMIN_HEADER, new_admin_key, restricted_api_args
from trtspec.serve.launch import (
    LEADER,
    ORCHESTRATOR,
    ORCHESTRATOR_ENV,
    leader_mode_argv,
    orchestrator_mode_argv,
    server_argv,
)

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
KEY_ENV = "TRTSPEC_ADMIN_KEY"
SECRET_KEY = "admin-key"
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
SERVICEMONITOR_API = "monitoring.coreos.com/v1"
# kubectl for mpirun's rsh agent in multi-node pods (copied into the image by the
# generated Dockerfile; registry.k8s.io publishes one image per Kubernetes release).
KUBECTL_IMAGE = "registry.k8s.io/kubectl:v1.33.0"
TOOLS_DIR = "/opt/trtspec-deploy"
# Where the stubs that call decoupled BLS beat inside the pod (trtspec.runtime.heartbeat);
# the liveness probe fails on a frozen one (the 2.51 deadlock, docs/design/triton-limits.md).
HEARTBEAT_DIR = "/tmp/trtspec-heartbeat"
EXIT_TIMEOUT_S = 45  # tritonserver waits this long for in-flight requests on SIGTERM

KUBESSH = """#!/bin/sh
# mpirun's rsh agent: run the command on a pod of this group (kubectl exec).
pod="$1"
shift
exec kubectl exec "$pod" -c worker -- /bin/sh -c "$*"
"""
LAUNCH = """#!/bin/sh
# Wait until every worker pod of this group answers, then run mpirun ("$@").
set -eu
i=1
while [ "$i" -lt "$TRTSPEC_GROUP_SIZE" ]; do
  until TOOLS/kubessh "$POD_NAME-$i" true; do
    echo "waiting for worker $POD_NAME-$i"; sleep 5
  done
  i=$((i + 1))
done
exec "$@"
""".replace("TOOLS", TOOLS_DIR)


@dataclass
class K8sOptions:
    """What the user chooses; everything else comes from the spec and the plan."""

    image: str
    name: str
    namespace: str = "default"
    gpus_per_node: int = 8
    replicas: int = 1
    hpa_max: int | None = None
    hpa_metric: str = rollout_k8s.DEFAULT_HPA_METRIC
    hpa_target: float = 4.0
    repo_source: str = "volume"  # volume | image
    pvc: str | None = None
    repo_image: str | None = None
    write_secret: bool = False
    secret_name: str | None = None

    @property
    def secret(self) -> str:
        return self.secret_name or f"{self.name}-admin"


@dataclass
class Served:
    """What one instance serves and where it finds it inside the container."""

    repo: str  # the model repository's path (the same inside the pod)
    mount_root: str  # the folder holding the repository and every engine it names
    models: list[str]  # the explicit load list
    engines: list[str]
    variants: list[str]
    routing: RoutingTable
    spec_hash: str
    repository_hash: str | None  # None: not built on this machine
    engine_dirs: list[str] = field(default_factory=list)


@dataclass
class Manifests:
    files: dict[str, list[dict[str, Any]]]  # file name -> resources
    extra: dict[str, str]  # file name -> text (Dockerfile, scripts)
    summary: dict[str, Any]

    def resources(self) -> list[dict[str, Any]]:
        return [doc for docs in self.files.values() for doc in docs]


# ------------------------------------------------------------------- helpers
def _labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "trtspec",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "triton",
    }


def _meta(name: str, opts: K8sOptions, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": _labels(opts.name), **extra}


def _annotations(spec: Any, served: Served, sizing: Sizing) -> dict[str, str]:
    out = {
        "trtspec.dev/spec": spec.name,
        "trtspec.dev/spec-hash": served.spec_hash,
        "trtspec.dev/repository-hash": served.repository_hash or "not built on this machine",
        "trtspec.dev/triton-image": str(spec.stack.triton_image),
        "trtspec.dev/trtllm-version": spec.stack.trtllm_version,
        "trtspec.dev/world-size": str(sizing.world_size),
        "trtspec.dev/launch": sizing.launch,
        "trtspec.dev/routing": json.dumps(served.routing.to_dict(), sort_keys=True),
    }
    return out


def _probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def _liveness() -> dict[str, Any]:
    """Triton's live endpoint and, unlike it, the stubs' heartbeats: a
    deadlocked router stub leaves tritonserver answering "live" and "ready"
    while every request hangs (docs/design/triton-limits.md)."""
    command = [
        "python3", "-m", "trtspec.runtime.heartbeat", HEARTBEAT_DIR,
        "--live-url", f"http://127.0.0.1:{HTTP_PORT}/v2/health/live",
    ]  # fmt: skip
    return {"exec": {"command": command}, "periodSeconds": 15, "failureThreshold": 4,
            "timeoutSeconds": 5}  # fmt: skip


def _triton_argv(served: Served, sizing: Sizing, opts: K8sOptions) -> list[str]:
    """The tritonserver command of the instance (rank 0's pod), as ``trtspec serve`` builds it."""
    restricted = restricted_api_args(f"$({KEY_ENV})")  # Kubernetes expands $(VAR) from env
    extra = [f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *restricted]
    if sizing.launch == LEADER:
        argv = leader_mode_argv(
            sizing.world_size, served.repo, engine_model=served.engines, host="0.0.0.0",
            http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
            binary="tritonserver", models=served.models, extra_args=extra,
        )  # fmt: skip
        if sizing.multi_node:
            gpus = sizing.gpus_per_pod
            pods = ["$(POD_NAME)"] + [f"$(POD_NAME)-{i}" for i in range(1, sizing.pods)]
            hosts = ",".join(f"{pod}:{gpus}" for pod in pods)
            agent = ["--host", hosts, "-mca", "plm_rsh_agent", f"{TOOLS_DIR}/kubessh"]
            argv = [argv[0], argv[1], *agent, *argv[2:]]
        return argv
    if sizing.launch == ORCHESTRATOR:
        one = server_argv(
            "tritonserver", served.repo, host="0.0.0.0", models=served.models,
            extra_args=["--disable-auto-complete-config",
                        "--backend-config=python,shm-region-prefix-name=prefix0_", *extra],
            http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
        )  # fmt: skip
        return orchestrator_mode_argv(one, gpus=sizing.world_size)
    return server_argv(
        "tritonserver", served.repo, host="0.0.0.0", models=served.models, extra_args=extra,
        http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
    )  # fmt: skip


def _resources(sizing: Sizing) -> dict[str, Any]:
    if not sizing.uses_gpu:
        return {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}
    gpus = sizing.gpus_per_pod
    return {
        "requests": {"cpu": str(4 * gpus), "memory": f"{32 * gpus}Gi"},
        "limits": {"nvidia.com/gpu": str(gpus), "memory": f"{48 * gpus}Gi"},
    }


def _volumes(served: Served, opts: K8sOptions) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if opts.repo_source == "volume":
        claim = opts.pvc or f"{opts.name}-models"
        volumes.append(
            {"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        )
        mounts.append({"name": "models", "mountPath": served.mount_root, "readOnly": True})
    rollout_volumes, rollout_mounts = rollout_k8s.volumes(opts.name)  # the shared rollout state
    return volumes + rollout_volumes, mounts + rollout_mounts


def _env(sizing: Sizing, opts: K8sOptions) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {
            "name": KEY_ENV,
            "valueFrom": {"secretKeyRef": {"name": opts.secret, "key": SECRET_KEY}},
        }
    ]
    env.append({"name": HEARTBEAT_ENV, "value": HEARTBEAT_DIR})
    env += rollout_k8s.env(opts.name)
    if sizing.launch == ORCHESTRATOR:
        env += [{"name": k, "value": v} for k, v in sorted(ORCHESTRATOR_ENV.items())]
    if sizing.multi_node:
        env += [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "TRTSPEC_GROUP_SIZE", "value": str(sizing.pods)},
        ]
    return env


def _image(opts: K8sOptions, sizing: Sizing) -> str:
    """The image the pods run: the repository image when the repository is an
    image layer, else the serving image (multi-node needs kubectl in it: the
    generated Dockerfile adds it, and --image must then name that build)."""
    if opts.repo_source == "image":
        if not opts.repo_image:
            raise DeployError(
                "--repo-source image needs --repo-image: the image the generated Dockerfile builds",
                "pass --repo-image REGISTRY/NAME:TAG (build and push it from the output folder)",
            )
        return opts.repo_image
    return opts.image


def _triton_container(
    served: Served, sizing: Sizing, opts: K8sOptions, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    argv = _triton_argv(served, sizing, opts)
    command = ["/bin/sh", f"{TOOLS_DIR}/launch.sh", *argv] if sizing.multi_node else argv
    period = 10
    return {
        "name": "tritonserver",
        "image": _image(opts, sizing),
        "command": command,
        "env": _env(sizing, opts),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # Triton listens only once every model has loaded: the start-up probe
        # allows the loading budget, then liveness and readiness take over.
        "startupProbe": _probe("/v2/health/ready", period, -(-sizing.startup_seconds // period), 5),
        "livenessProbe": _liveness(),
        "readinessProbe": _probe("/v2/health/ready", 5, 3, 3),
        "resources": _resources(sizing),
        "volumeMounts": mounts,
    }


# ------------------------------------------------------------------ resources
def _pod_spec(containers: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "terminationGracePeriodSeconds": EXIT_TIMEOUT_S + 15,
        "containers": containers,
        "volumes": volumes,
    }


def _deployment(spec: Any, served: Served, sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    volumes, mounts = _volumes(served, opts)
    notes = _annotations(spec, served, sizing)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(opts.name, opts, annotations=notes),
        "spec": {
            **_replicas(opts),
            "selector": {"matchLabels": _labels(opts.name)},
            # GPUs are scarce: replace one pod at a time without a surge pod.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": {"labels": _labels(opts.name), "annotations": notes},
                "spec": {
                    "serviceAccountName": rollout_k8s.account_name(opts.name),
                    **_pod_spec([_triton_container(served, sizing, opts, mounts)], volumes),
                },
            },
        },
    }


def _leaderworkerset(spec: Any, served: Served, sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    volumes, mounts = _volumes(served, opts)
    tools = {
        "name": "trtspec-launch",
        "configMap": {"name": f"{opts.name}-launch", "defaultMode": 0o755},
    }
    tool_mount = {"name": "trtspec-launch", "mountPath": TOOLS_DIR, "readOnly": True}
    notes = _annotations(spec, served, sizing)
    leader = _triton_container(served, sizing, opts, [*mounts, tool_mount])
    worker = {
        "name": "worker",
        "image": _image(opts, sizing),
        # mpirun reaches this pod through `kubectl exec` (kubessh) and starts its ranks here.
        "command": ["sleep", "infinity"],
        "resources": _resources(sizing),
        "volumeMounts": mounts,
    }
    role = "trtspec.dev/role"
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": _meta(opts.name, opts, annotations=notes),
        "spec": {
            **_replicas(opts),
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": sizing.pods,
                # One rank lost means the MPI job is gone: restart the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {
                        "labels": {**_labels(opts.name), role: "leader"},
                        "annotations": notes,
                    },
                    "spec": {
                        "serviceAccountName": f"{opts.name}-mpi",
                        **_pod_spec([leader], [*volumes, tools]),
                    },
                },
                "workerTemplate": {
                    "metadata": {"labels": {**_labels(opts.name), role: "worker"}},
                    "spec": _pod_spec([worker], volumes),
                },
            },
        },
    }


def _service(sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    selector = dict(_labels(opts.name))
    if sizing.multi_node:
        selector["trtspec.dev/role"] = "leader"  # only rank 0 serves HTTP/gRPC/metrics
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(opts.name, opts),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {"name": "http", "port": HTTP_PORT, "targetPort": "http"},
                {"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc"},
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
            ],
        },
    }


def _servicemonitor(opts: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": SERVICEMONITOR_API,
        "kind": "ServiceMonitor",
        "metadata": _meta(opts.name, opts),
        "spec": {
            "selector": {"matchLabels": _labels(opts.name)},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def _replicas(opts: K8sOptions) -> dict[str, Any]:
    """Replicas, unless an autoscaler owns them (each apply would reset its scale)."""
    return {} if opts.hpa_max is not None else {"replicas": opts.replicas}


def _hpa(sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    target = (
        {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": opts.name}
        if sizing.multi_node
        else {"apiVersion": "apps/v1", "kind": "Deployment", "name": opts.name}
    )
    return rollout_k8s.hpa(
        lambda name, **extra: _meta(name, opts, **extra),
        target,
        min_replicas=opts.replicas,
        max_replicas=opts.hpa_max,
        metric=opts.hpa_metric,
        average=opts.hpa_target,
        startup_seconds=sizing.startup_seconds,
    )


def _rbac(opts: K8sOptions) -> list[dict[str, Any]]:
    name = f"{opts.name}-mpi"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(name, opts)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _meta(name, opts),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _meta(name, opts),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": opts.namespace}],
        },
    ]


def _dockerfile(spec: Any, served: Served, sizing: Sizing, opts: K8sOptions) -> str | None:
    """The image layer(s) the deployment needs on top of the serving image, if any."""
    lines: list[str] = []
    if sizing.multi_node:
        lines += [f"COPY --from={KUBECTL_IMAGE} /bin/kubectl /usr/local/bin/kubectl"]
    if opts.repo_source == "image":
        lines += [
            f"# The model repository as an image layer (repository hash {served.repository_hash})",
            f"COPY {served.repo.lstrip('/')} {served.repo}",
            *(f"COPY {d.lstrip('/')} {d}" for d in served.engine_dirs),
        ]
    if not lines:
        return None
    head = [
        f"# Built by `trtspec deploy k8s` for spec {spec.name}. Build it from / (or a folder",
        "# holding the same absolute paths) so the repository's engine paths stay valid:",
        f"#   docker build -f Dockerfile -t {opts.repo_image or opts.image} /",
        f"# {opts.image} is the trtspec serving image: the project Dockerfile built with",
        f"# --build-arg TRITON_IMAGE={spec.stack.triton_image}",
        f"FROM {opts.image}",
    ]
    return "\n".join([*head, *lines]) + "\n"


# ------------------------------------------------------------------- assemble
# A DNS-1123 label, short enough for the "-admin"/"-launch"/"-models" names made from it.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,44}[a-z0-9])?$")


def build(spec: Any, served: Served, sizing: Sizing, opts: K8sOptions) -> Manifests:
    """Every resource of the deployment, by output file."""
    if not _NAME.match(opts.name):
        raise DeployError(
            f"resource name {opts.name!r} is not a DNS-1123 label of at most 46 characters",
            "pass --name with lower-case letters, digits and '-', starting and ending "
            "with a letter or digit",
        )
    if not opts.image:
        raise DeployError(
            "no serving image: the pods need trtspec installed on the pinned Triton image",
            f"build the project Dockerfile with --build-arg TRITON_IMAGE="
            f"{spec.stack.triton_image} and pass it with --image",
        )
    files: dict[str, list[dict[str, Any]]] = {}
    extra: dict[str, str] = {}
    if sizing.multi_node:
        files["leaderworkerset.yaml"] = [_leaderworkerset(spec, served, sizing, opts)]
        files["rbac.yaml"] = _rbac(opts)
        files["configmap.yaml"] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(f"{opts.name}-launch", opts),
                "data": {"kubessh": KUBESSH, "launch.sh": LAUNCH},
            }
        ]
    else:
        files["deployment.yaml"] = [_deployment(spec, served, sizing, opts)]
    files["service.yaml"] = [_service(sizing, opts)]
    files["servicemonitor.yaml"] = [_servicemonitor(opts)]
    meta = lambda name, **extra: _meta(name, opts, **extra)  # noqa: E731
    account = f"{opts.name}-mpi" if sizing.multi_node else rollout_k8s.account_name(opts.name)
    files["rollout.yaml"] = rollout_k8s.objects(opts.name, opts.namespace, meta, account)
    if opts.hpa_max is not None:
        files["hpa.yaml"] = [_hpa(sizing, opts)]
        files["prometheus-adapter.yaml"] = [
            rollout_k8s.adapter_config(opts.name, meta, opts.hpa_metric)
        ]
    if opts.write_secret:
        files["secret.yaml"] = [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": _meta(opts.secret, opts),
                "type": "Opaque",
                "stringData": {SECRET_KEY: new_admin_key()},
            }
        ]
    dockerfile = _dockerfile(spec, served, sizing, opts)
    if dockerfile:
        extra["Dockerfile"] = dockerfile
    summary = {
        "schema_version": 1,
        "spec": spec.name,
        "spec_hash": served.spec_hash,
        "repository": served.repo,
        "repository_hash": served.repository_hash,
        "repo_source": opts.repo_source,
        "image": _image(opts, sizing),
        "triton_image": spec.stack.triton_image,
        "models": served.models,
        "variants": served.variants,
        "routing": served.routing.to_dict(),
        "replicas": opts.replicas,
        "sizing": sizing.to_dict(),
        "admin_header": ADMIN_HEADER,
        "secret": {"name": opts.secret, "key": SECRET_KEY},
        "files": sorted([*files, *extra]),
    }
    return Manifests(files, extra, summary)


class _Dumper(yaml.SafeDumper):
    """Plain YAML: a value used twice is written twice, not as an anchor."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(docs: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100) for d in docs)


def write(out: Path, manifests: Manifests, *, force: bool = False) -> list[Path]:
    """Write the directory atomically: a staging folder renamed into place."""
    out = Path(out)
    if out.exists() and not force:
        raise DeployError(
            f"{out} already exists",
            "pass --force to replace it, or choose another --out",
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = make_staging_dir(f".{out.name}.", out.parent)
    try:
        for name, docs in manifests.files.items():
            (staging / name).write_text(render(docs), encoding="utf-8")
            if name == "secret.yaml":
                os.chmod(staging / name, 0o600)
        for name, text in manifests.extra.items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / "trtspec-deploy.json").write_text(
            json.dumps(manifests.summary, indent=2) + "\n", encoding="utf-8"
        )
        if out.exists():
            old = out.with_name(f".{out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out, old)
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(out.iterdir())


def routed_variants(table: RoutingTable) -> list[str]:
    """The variants the routing table can send a request to (baseline first)."""
    names = table.variants()
    return sorted(names, key=lambda v: (v != BASELINE, v))
