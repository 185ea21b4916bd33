"""The types the Kubernetes writers share: what the user chose
(``K8sOptions``), what one instance serves (``Served``, read by
``trtspec.deploy.inputs``), the written result (``Manifests``), and the
names, labels and ports every object of one deployment agrees on. No Click.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trtspec.artifacts.routing import RoutingTable

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
# Inside the pod: the volume (or image layer) holding the repository and its
# engines, the project Dockerfile's VOLUME; and the writable copy of the
# repository with its paths moved there (trtspec.deploy.relocate).
MODELS_DIR = "/models"
REPO_DIR = "/trtspec/repository"
ROUTING_DIR = "/etc/trtspec/routing"  # a pool's routing table (trtspec.deploy.gateway)
# The image's non-root user: NGC Triton images create `triton-server` with
# uid/gid 1000 (triton-inference-server/server build.py, TRITON_SERVER_USER);
# the project Dockerfile switches to it.
IMAGE_UID = 1000
ROLE_LABEL = "trtspec.dev/role"
SUMMARY_DIR = "trtspec"  # not read by `kubectl apply -f DIR` (it does not recurse)
SUMMARY_FILE = "deploy.json"


@dataclass
class K8sOptions:
    """What the user chooses; everything else comes from the spec and the plan."""

    image: str
    name: str
    namespace: str = "default"
    gpus_per_node: int = 8
    replicas: int = 1
    hpa_max: int | None = None
    hpa_metric: str = "router"  # rollout_k8s.DEFAULT_HPA_METRIC
    hpa_target: float = 4.0
    repo_source: str = "volume"  # volume | image
    pvc: str | None = None  # an existing claim; None: write one
    pvc_size: str | None = None
    storage_class: str | None = None
    models_path: str = MODELS_DIR
    repo_image: str | None = None
    write_secret: bool = False
    secret_name: str | None = None
    monitor_labels: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] | None = None  # None: the GPU taint's
    compute_capability: str | None = None  # overrides what the engines' build recorded
    gateway: str | None = None  # a Gateway to attach per-route HTTPRoutes to
    ssh_secret_name: str | None = None
    routing_config: str | None = None  # a ConfigMap whose routing.json the pods serve

    @property
    def secret(self) -> str:
        return self.secret_name or f"{self.name}-admin"

    @property
    def ssh_secret(self) -> str:
        return self.ssh_secret_name or f"{self.name}-ssh"

    @property
    def claim(self) -> str:
        return self.pvc or f"{self.name}-models"


@dataclass
class Served:
    """What one instance serves and where it finds it."""

    repo: str  # the model repository's path on the builder
    root: str  # the builder's folder holding the repository and every engine it names
    models: list[str]  # the explicit load list
    engines: list[str]
    variants: list[str]
    routing: RoutingTable
    spec_hash: str
    repository_hash: str | None  # None: not built on this machine
    engine_dirs: list[str] = field(default_factory=list)
    # What the engines' builds recorded (empty: unknown, e.g. not built here)
    compute_capabilities: list[str] = field(default_factory=list)
    trtllm_versions: list[str] = field(default_factory=list)
    engine_gpus_per_node: list[int] = field(default_factory=list)
    data_bytes: int | None = None  # the repository and its engines, when on this machine

    @property
    def repo_rel(self) -> str:
        """The repository's path below ``root`` (where it sits on the volume)."""
        import os

        return os.path.relpath(self.repo, self.root)


@dataclass
class Manifests:
    files: dict[str, list[dict[str, Any]]]  # file name -> resources
    extra: dict[str, str]  # file name -> text (Dockerfile)
    summary: dict[str, Any]

    def resources(self) -> list[dict[str, Any]]:
        return [doc for docs in self.files.values() for doc in docs]


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "trtspec",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "triton",
    }


def meta(name: str, opts: K8sOptions, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": opts.namespace, "labels": labels(opts.name), **extra}
