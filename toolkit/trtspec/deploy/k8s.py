"""Kubernetes manifests for the engine flow: what ``trtspec serve`` runs on one
machine, as a Deployment (or, when TP×PP exceeds one node's GPUs, a
LeaderWorkerSet, ``k8s_multinode``), with a Service, a ServiceMonitor, a
PodDisruptionBudget, the volume claim for the repository (and a Job that
checks what was copied onto it), an optional HorizontalPodAutoscaler, the
restricted-API key from a Secret, and optionally the Gateway API objects that
split each route's canary between per-variant pools (``gateway``). The pod
itself is ``k8s_pod``'s.

``build`` assembles them by output file; ``write`` puts them in a folder that
``kubectl apply -f`` reads whole: every ``.yaml`` there is a Kubernetes
object, and what trtspec decided (``trtspec/deploy.json``) sits in a
subfolder, which ``kubectl apply -f DIR`` does not enter (cli-runtime's
``ExpandPathsToFileVisitors`` skips folders unless ``-R``). Plain manifests,
not a Helm chart: every value trtspec decides comes from the spec and the
benchmark, so a template language would only re-expose them as knobs that can
disagree with the measurement. No Click here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from trtspec.deploy import k8s_multinode, rollout_k8s
from trtspec.deploy.k8s_pod import (
    SECRET_KEY,
    compute_capability,
    gib_quantity,
    image,
    pod_security,
    pod_spec,
    relocate_container,
    triton_container,
    volumes,
)
from trtspec.deploy.options import (
    GRPC_PORT,
    HTTP_PORT,
    METRICS_PORT,
    ROLE_LABEL,
    SUMMARY_DIR,
    SUMMARY_FILE,
    K8sOptions,
    Manifests,
    Served,
    labels,
    meta,
)
from trtspec.deploy.sizing import DeployError, Sizing
from trtspec.fsutil import make_staging_dir
from trtspec.serve.access import ADMIN_HEADER, new_admin_key
from trtspec.versions import parse_version, shipped_by

SERVICEMONITOR_API = "monitoring.coreos.com/v1"
POPULATED_MARKER = ".trtspec-populated"
PVC_HEADROOM = 1.2  # claim size over the bytes it must hold


def pod_annotations(spec: Any, served: Served, sizing: Sizing) -> dict[str, str]:
    return {
        "trtspec.dev/spec": spec.name,
        "trtspec.dev/spec-hash": served.spec_hash,
        "trtspec.dev/repository-hash": served.repository_hash or "not built on this machine",
        "trtspec.dev/triton-image": str(spec.stack.triton_image),
        "trtspec.dev/trtllm-version": spec.stack.trtllm_version,
        "trtspec.dev/world-size": str(sizing.world_size),
        "trtspec.dev/launch": sizing.launch,
        "trtspec.dev/routing": json.dumps(served.routing.to_dict(), sort_keys=True),
    }


def check_trtllm_version(spec: Any, served: Served, sizing: Sizing) -> None:
    """Engines run only under the TensorRT-LLM they were built with: the
    version their builds recorded must be the one the pinned image ships."""
    if not sizing.uses_gpu or not served.trtllm_versions:
        return
    image_ref = str(spec.stack.triton_image)
    shipped = shipped_by(image_ref)
    built = served.trtllm_versions
    if len(built) > 1 or (
        shipped is not None and parse_version(built[0]) != parse_version(shipped)
    ):
        raise DeployError(
            f"the served engines were built with TensorRT-LLM {', '.join(built)}, but "
            f"{image_ref} ships {shipped or 'an unknown version'}",
            "rebuild the engines in the image the pods run (stack.triton_image), or pin "
            "stack.triton_image to the container that built them",
        )


# ------------------------------------------------------------------ resources
def deployment(
    spec: Any, served: Served, sizing: Sizing, opts: K8sOptions, *, replicas: bool
) -> dict[str, Any]:
    vols, mounts = volumes(served, sizing, opts)
    notes = pod_annotations(spec, served, sizing)
    one = opts.replicas == 1 and replicas
    body: dict[str, Any] = {
        "selector": {"matchLabels": labels(opts.name)},
        # GPUs are scarce: several replicas update one pod at a time without a
        # surge pod; a single one surges (the update needs one instance's GPUs
        # free) rather than stopping the only replica first.
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}
            if one
            else {"maxSurge": 0, "maxUnavailable": 1},
        },
        "template": {
            "metadata": {"labels": labels(opts.name), "annotations": notes},
            # the account that may read and patch the rollout ConfigMap (rollout_k8s)
            "spec": pod_spec(
                [triton_container(served, sizing, opts, mounts)],
                vols,
                served,
                sizing,
                opts,
                serviceAccountName=rollout_k8s.account_name(opts.name),
            ),
        },
    }
    if replicas:  # left out when an autoscaler owns them (an apply would reset its scale)
        body = {"replicas": opts.replicas, **body}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(opts.name, opts, annotations=notes),
        "spec": body,
    }


def service(sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    selector = dict(labels(opts.name))
    if sizing.multi_node:
        selector[ROLE_LABEL] = "leader"  # only rank 0 serves HTTP/gRPC/metrics
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(opts.name, opts),
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


def servicemonitor(opts: K8sOptions) -> dict[str, Any]:
    """Prometheus Operator selects ServiceMonitors by their own labels
    (kube-prometheus-stack: ``release: <its Helm release>``): ``--monitor-label``."""
    doc_meta = meta(opts.name, opts)
    doc_meta["labels"] = {**doc_meta["labels"], **opts.monitor_labels}
    return {
        "apiVersion": SERVICEMONITOR_API,
        "kind": "ServiceMonitor",
        "metadata": doc_meta,
        "spec": {
            "selector": {"matchLabels": labels(opts.name)},
            "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }


def hpa(sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    """The autoscaler (``rollout_k8s``: its metric, adapter rule and capped
    scale-down window) of this deployment's Deployment or LeaderWorkerSet."""
    target = (
        {"apiVersion": k8s_multinode.LWS_API, "kind": "LeaderWorkerSet", "name": opts.name}
        if sizing.multi_node
        else {"apiVersion": "apps/v1", "kind": "Deployment", "name": opts.name}
    )
    return rollout_k8s.hpa(
        lambda name, **extra: meta(name, opts, **extra),
        target,
        min_replicas=opts.replicas,
        max_replicas=opts.hpa_max,
        metric=opts.hpa_metric,
        average=opts.hpa_target,
        startup_seconds=sizing.startup_seconds,
    )


def disruption_budget(opts: K8sOptions) -> dict[str, Any]:
    """Voluntary evictions (node drains) take one pod at a time; with a single
    replica none, so a drain waits instead of ending the only instance."""
    allowed = 0 if opts.replicas == 1 and opts.hpa_max is None else 1
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(opts.name, opts),
        "spec": {"maxUnavailable": allowed, "selector": {"matchLabels": labels(opts.name)}},
    }


def claim_size(served: Served, sizing: Sizing, opts: K8sOptions) -> str:
    """The claim's size: ``--pvc-size``, else the repository and engines on
    this machine (or the memory plan's weights of every rank) with headroom."""
    if opts.pvc_size:
        return opts.pvc_size
    data = served.data_bytes
    fit = sizing.fit
    if data is None and fit is not None and fit.known:
        data = max(0, fit.fixed) * max(1, sizing.world_size)
    if data is None:
        raise DeployError(
            "the size of the repository's volume is unknown (no built repository and no "
            "memory plan on this machine)",
            "pass --pvc-size (e.g. 500Gi), or --pvc with an existing claim",
        )
    return gib_quantity(max(1 << 30, int(data * PVC_HEADROOM)))


def models_claim(served: Served, sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    body: dict[str, Any] = {
        # every replica's pods read it, on any node; the populate Job writes it
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": claim_size(served, sizing, opts)}},
    }
    if opts.storage_class:
        body["storageClassName"] = opts.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(opts.claim, opts),
        "spec": body,
    }


def populate_job(served: Served, sizing: Sizing, opts: K8sOptions) -> dict[str, Any]:
    """A pod holding the claim read-write for copying the builder's folder onto
    it; when the marker file appears it checks what arrived the way the serving
    pods will (every moved path on the volume, the repository's fingerprint)."""
    check = relocate_container(served, opts)
    marker = f"{opts.models_path.rstrip('/')}/{POPULATED_MARKER}"
    wait = (
        f'echo "copy {served.root}/. into {opts.models_path}/ of this pod, then touch {marker}"; '
        f"until [ -f {marker} ]; do sleep 10; done; "
        f'exec "$@"'
    )
    command = ["/bin/sh", "-c", wait, "populate", *check["command"]]
    container = {
        **check,
        "name": "populate",
        "command": command,
        "volumeMounts": [
            {"name": "models", "mountPath": opts.models_path},
            {"name": "repository", "mountPath": check["volumeMounts"][0]["mountPath"]},
        ],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(f"{opts.name}-populate", opts),
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 6 * 3600,
            "template": {
                "metadata": {"labels": {**labels(opts.name), ROLE_LABEL: "populate"}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": pod_security(),
                    "containers": [container],
                    "volumes": [
                        {"name": "models", "persistentVolumeClaim": {"claimName": opts.claim}},
                        {"name": "repository", "emptyDir": {}},
                    ],
                },
            },
        },
    }


def dockerfile(spec: Any, served: Served, sizing: Sizing, opts: K8sOptions) -> str | None:
    """The image layer(s) the deployment needs on top of the serving image, if any."""
    lines: list[str] = []
    if opts.repo_source == "image":
        rels = [os.path.relpath(p, served.root) for p in [served.repo, *served.engine_dirs]]
        lines += [
            f"# The model repository and its engines (repository hash {served.repository_hash}),",
            f"# at {opts.models_path} as on the volume; the pods move the repository's paths there",
            *(f"COPY --chown=1000:1000 {rel} {opts.models_path.rstrip('/')}/{rel}" for rel in rels),
        ]
    if not lines:
        return None
    head = [
        f"# Built by `trtspec deploy k8s` for spec {spec.name}. Build it from {served.root}",
        "# (the folder holding the repository and its engines):",
        f"#   docker build -f Dockerfile -t {opts.repo_image or opts.image} {served.root}",
        f"# {opts.image} is the trtspec serving image: the project Dockerfile built with",
        f"# --build-arg TRITON_IMAGE={spec.stack.triton_image}",
        f"FROM {opts.image}",
    ]
    return "\n".join([*head, *lines, "USER 1000:1000"]) + "\n"


# ------------------------------------------------------------------- assemble
# A DNS-1123 label, short enough for the "-admin"/"-launch"/"-models" names made from it.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,44}[a-z0-9])?$")


def check_options(spec: Any, opts: K8sOptions) -> None:
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
    if not opts.models_path.startswith("/") or opts.models_path.rstrip("/") == "":
        raise DeployError(
            f"--models-path {opts.models_path!r} is not an absolute folder inside the image",
            "pass the image's volume folder, e.g. --models-path /models",
        )


def build(spec: Any, served: Served, sizing: Sizing, opts: K8sOptions) -> Manifests:
    """Every resource of the deployment, by output file."""
    check_options(spec, opts)
    check_trtllm_version(spec, served, sizing)
    autoscaled = opts.hpa_max is not None
    files: dict[str, list[dict[str, Any]]] = {}
    extra: dict[str, str] = {}
    if sizing.multi_node:
        notes = pod_annotations(spec, served, sizing)
        files["leaderworkerset.yaml"] = [
            k8s_multinode.leaderworkerset(served, sizing, opts, notes, replicas=not autoscaled)
        ]
        files["configmap.yaml"] = [k8s_multinode.launch_configmap(opts)]
    else:
        files["deployment.yaml"] = [deployment(spec, served, sizing, opts, replicas=not autoscaled)]
    files["service.yaml"] = [service(sizing, opts)]
    files["servicemonitor.yaml"] = [servicemonitor(opts)]
    files["poddisruptionbudget.yaml"] = [disruption_budget(opts)]
    # the rollout state every router watches and the RBAC to patch it (rollout_k8s)
    bound = lambda name, **extra: meta(name, opts, **extra)  # noqa: E731
    files["rollout.yaml"] = rollout_k8s.objects(
        opts.name, opts.namespace, bound, rollout_k8s.account_name(opts.name)
    )
    if opts.repo_source == "volume" and opts.pvc is None:
        files["volume.yaml"] = [
            models_claim(served, sizing, opts),
            populate_job(served, sizing, opts),
        ]
    if autoscaled:
        files["hpa.yaml"] = [hpa(sizing, opts)]
        files["prometheus-adapter.yaml"] = [
            rollout_k8s.adapter_config(opts.name, bound, opts.hpa_metric)
        ]
    if opts.write_secret:
        files["secret.yaml"] = [
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": meta(opts.secret, opts),
                "type": "Opaque",
                "stringData": {SECRET_KEY: new_admin_key()},
            }
        ]
    # Other objects of the same deployment join here (e.g. the Gateway API pools).
    text = dockerfile(spec, served, sizing, opts)
    told = _notes(served, sizing, opts)
    if text:
        extra["Dockerfile"] = text
    summary = {
        "schema_version": 2,
        "spec": spec.name,
        "spec_hash": served.spec_hash,
        "repository": served.repo,
        "repository_hash": served.repository_hash,
        "volume_root": served.root,
        "models_path": opts.models_path,
        "repo_source": opts.repo_source,
        "image": image(opts),
        "triton_image": spec.stack.triton_image,
        "models": served.models,
        "variants": served.variants,
        "routing": served.routing.to_dict(),
        "replicas": opts.replicas,
        "autoscaled": autoscaled,
        "sizing": sizing.to_dict(),
        "admin_header": ADMIN_HEADER,
        "secret": {"name": opts.secret, "key": SECRET_KEY},
        "files": sorted([*files, *extra]),
        "notes": told,
    }
    return Manifests(files, extra, summary)


def _notes(served: Served, sizing: Sizing, opts: K8sOptions) -> list[str]:
    """What the user should know about the written manifests (printed as notes)."""
    out: list[str] = []
    if sizing.uses_gpu and compute_capability(served, sizing, opts) is None:
        out.append(
            "the engines' GPU architecture is unknown (not built on this machine, or built "
            "before trtspec recorded it): no GPU node affinity; pass --compute-capability "
            "MAJOR.MINOR of the GPUs that built them"
        )
    if not opts.monitor_labels:
        out.append(
            "the ServiceMonitor carries only the app labels: Prometheus Operator installs "
            "select ServiceMonitors by label (kube-prometheus-stack: release=<its Helm "
            "release>); pass --monitor-label KEY=VALUE"
        )
    if opts.replicas == 1 and opts.hpa_max is None:
        out.append(
            "one replica: its PodDisruptionBudget allows no eviction (a node drain waits), "
            "and an update needs one instance's GPUs free for the new pod"
        )
    if sizing.multi_node:
        out.append(
            f"multi-node: create the SSH key Secret {opts.ssh_secret} before applying "
            "(docs/guide/deploy.md, Multi-node)"
        )
    if opts.repo_source == "volume" and opts.pvc is None:
        out.append(
            f"copy {served.root}/ onto the claim {opts.claim} through the "
            f"{opts.name}-populate Job's pod, then touch {POPULATED_MARKER} there"
        )
    return out


class _Dumper(yaml.SafeDumper):
    """Plain YAML: a value used twice is written twice, not as an anchor."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(docs: list[dict[str, Any]]) -> str:
    return "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=100) for d in docs)


def summary_path(out: Path) -> Path:
    """Where ``write`` puts what was decided (outside what ``kubectl apply -f`` reads)."""
    return Path(out) / SUMMARY_DIR / SUMMARY_FILE


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
        summary = summary_path(staging)
        summary.parent.mkdir()
        summary.write_text(json.dumps(manifests.summary, indent=2) + "\n", encoding="utf-8")
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
