"""The pod every Kubernetes object of an engine-flow deployment runs: the
tritonserver container with the command ``trtspec serve`` would run (from
``trtspec.serve.launch``), its probes, the restricted-API key, resources from
the sizing (GPUs, and host memory from the memory plan), the init container
that moves the repository's paths to where the volume is mounted
(``trtspec.deploy.relocate``), the volumes, a ``restricted``-profile
security context (non-root as the image's ``triton-server`` user), GPU
tolerations and the node affinity that keeps the engines on GPUs of the
architecture they were built for (NVIDIA GPU feature discovery's labels). No
Click here.
"""

from __future__ import annotations

from typing import Any

from trtspec.deploy import rollout_k8s
from trtspec.deploy.options import (
    GRPC_PORT,
    HTTP_PORT,
    IMAGE_UID,
    METRICS_PORT,
    REPO_DIR,
    ROUTING_DIR,
    K8sOptions,
    Served,
)
from trtspec.deploy.sizing import DeployError, Sizing
from trtspec.runtime.heartbeat import DIR_ENV as HEARTBEAT_ENV
from trtspec.serve.access import restricted_api_args
from trtspec.serve.launch import (
    LEADER,
    ORCHESTRATOR,
    ORCHESTRATOR_ENV,
    leader_mode_argv,
    orchestrator_mode_argv,
    server_argv,
)

KEY_ENV = "TRTSPEC_ADMIN_KEY"
SECRET_KEY = "admin-key"
# Where the stubs that call decoupled BLS beat inside the pod (trtspec.runtime.heartbeat);
# the liveness probe fails on a frozen one (the 2.51 deadlock, docs/design/triton-limits.md).
HEARTBEAT_DIR = "/tmp/trtspec-heartbeat"
EXIT_TIMEOUT_S = 45  # tritonserver waits this long for in-flight requests on SIGTERM
# NVIDIA GPU feature discovery's node labels (NVIDIA/k8s-device-plugin v0.19.3,
# internal/lm/resource.go: newArchitectureLabels writes
# <resource>.compute.major/.compute.minor/.family for nvidia.com/gpu).
GFD_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
GFD_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
# The taint GPU node pools commonly carry (GKE and AKS add it to GPU pools; the
# GPU operator's docs use it): tolerated unless --toleration replaces it.
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
SSH_PORT = 2222  # the workers' sshd (as NVIDIA Dynamo's operator: MpiRunSshPort)
SSH_DIR = "/etc/trtspec-ssh"  # the key pair Secret, mounted
TOOLS_DIR = "/opt/trtspec-deploy"  # the launch scripts ConfigMap, mounted
# Variables the ranks started over SSH need from the leader (ssh gives a remote
# command sshd's environment, not the container's).
MPI_EXPORTS = ("PATH", "LD_LIBRARY_PATH", "HOME")


def gib_quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity in whole GiB, rounded up."""
    return f"{-(-n // (1 << 30))}Gi"


def probe(path: str, period: int, failures: int, timeout: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def liveness() -> dict[str, Any]:
    """Triton's live endpoint and, unlike it, the stubs' heartbeats: a
    deadlocked router stub leaves tritonserver answering "live" and "ready"
    while every request hangs (docs/design/triton-limits.md)."""
    command = [
        "python3", "-m", "trtspec.runtime.heartbeat", HEARTBEAT_DIR,
        "--live-url", f"http://127.0.0.1:{HTTP_PORT}/v2/health/live",
    ]  # fmt: skip
    return {"exec": {"command": command}, "periodSeconds": 15, "failureThreshold": 4,
            "timeoutSeconds": 5}  # fmt: skip


def mpi_hosts(sizing: Sizing, opts: K8sOptions) -> list[str]:
    """The group's pods by DNS name: a LeaderWorkerSet names the leader
    ``<lws>-<group>`` and its workers ``<lws>-<group>-<i>``, each under the
    headless Service named after the LeaderWorkerSet (its pods' subdomain)."""
    pods = ["$(POD_NAME)"] + [f"$(POD_NAME)-{i}" for i in range(1, sizing.pods)]
    return [f"{pod}.{opts.name}" for pod in pods]


def triton_argv(served: Served, sizing: Sizing, opts: K8sOptions) -> list[str]:
    """The tritonserver command of the instance (rank 0's pod), as ``trtspec serve`` builds it."""
    restricted = restricted_api_args(f"$({KEY_ENV})")  # Kubernetes expands $(VAR) from env
    extra = [f"--exit-timeout-secs={EXIT_TIMEOUT_S}", *restricted]
    if sizing.launch == LEADER:
        argv = leader_mode_argv(
            sizing.world_size, REPO_DIR, engine_model=served.engines, host="0.0.0.0",
            binary="tritonserver", models=served.models, extra_args=extra,
            http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
        )  # fmt: skip
        if sizing.multi_node:
            hosts = ",".join(f"{h}:{sizing.gpus_per_pod}" for h in mpi_hosts(sizing, opts))
            ssh = (
                f"-p {SSH_PORT} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
                "-i $(HOME)/.ssh/id_trtspec"
            )
            agent = ["--host", hosts, "--mca", "plm_rsh_args", ssh]
            for name in MPI_EXPORTS:
                agent += ["-x", name]
            argv = [argv[0], argv[1], *agent, *argv[2:]]
        return argv
    if sizing.launch == ORCHESTRATOR:
        one = server_argv(
            "tritonserver", REPO_DIR, host="0.0.0.0", models=served.models,
            extra_args=["--disable-auto-complete-config",
                        "--backend-config=python,shm-region-prefix-name=prefix0_", *extra],
            http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
        )  # fmt: skip
        return orchestrator_mode_argv(one, gpus=sizing.world_size)
    return server_argv(
        "tritonserver", REPO_DIR, host="0.0.0.0", models=served.models, extra_args=extra,
        http_port=HTTP_PORT, grpc_port=GRPC_PORT, metrics_port=METRICS_PORT,
    )  # fmt: skip


def resources(sizing: Sizing) -> dict[str, Any]:
    """CPU and host memory requests (memory from the sizing; the limit adds
    /dev/shm, a memory-backed volume the pod's memory pays for) and GPUs."""
    host, shm = sizing.host_bytes, sizing.shm_bytes
    if not sizing.uses_gpu:
        return {
            "requests": {"cpu": "4", "memory": gib_quantity(host)},
            "limits": {"memory": gib_quantity(host + shm)},
        }
    gpus = sizing.gpus_per_pod
    return {
        "requests": {"cpu": str(4 * gpus), "memory": gib_quantity(host)},
        "limits": {"nvidia.com/gpu": str(gpus), "memory": gib_quantity(host + shm)},
    }


def container_security() -> dict[str, Any]:
    """What Kubernetes' ``restricted`` pod security standard asks of a container."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "fsGroup": IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def compute_capability(served: Served, sizing: Sizing, opts: K8sOptions) -> str | None:
    """The compute capability the engines were built for: ``--compute-capability``,
    else what every served engine's build recorded (they must agree)."""
    if not sizing.uses_gpu:
        return None
    if opts.compute_capability:
        cap = opts.compute_capability
    elif len(served.compute_capabilities) > 1:
        raise DeployError(
            f"the served engines were built on GPUs of different compute capabilities "
            f"({', '.join(served.compute_capabilities)}); one pod runs them all on one GPU type",
            "rebuild them on one GPU type (TensorRT engines run only on the architecture "
            "they were built for)",
        )
    elif served.compute_capabilities:
        cap = served.compute_capabilities[0]
    else:
        return None
    major, dot, minor = cap.partition(".")
    if not (major.isdigit() and dot and minor.isdigit()):
        raise DeployError(
            f"compute capability {cap!r} is not MAJOR.MINOR",
            "pass it as nvidia-smi --query-gpu=compute_cap prints it, e.g. 9.0",
        )
    return cap


def affinity(served: Served, sizing: Sizing, opts: K8sOptions) -> dict[str, Any] | None:
    """Nodes whose GPUs have the engines' compute capability (GFD labels)."""
    cap = compute_capability(served, sizing, opts)
    if cap is None:
        return None
    major, _, minor = cap.partition(".")
    terms = [
        {"key": GFD_COMPUTE_MAJOR, "operator": "In", "values": [major]},
        {"key": GFD_COMPUTE_MINOR, "operator": "In", "values": [minor]},
    ]
    required = {"nodeSelectorTerms": [{"matchExpressions": terms}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def env(sizing: Sizing, opts: K8sOptions) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {"name": opts.secret, "key": SECRET_KEY}}},
        {"name": HEARTBEAT_ENV, "value": HEARTBEAT_DIR},
        *rollout_k8s.env(opts.name),  # where the router finds the shared rollout state
    ]
    if sizing.launch == ORCHESTRATOR:
        out += [{"name": k, "value": v} for k, v in sorted(ORCHESTRATOR_ENV.items())]
    if sizing.multi_node:
        out += [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "HOME", "value": "/tmp/trtspec-home"},
            {"name": "TRTSPEC_GROUP_SIZE", "value": str(sizing.pods)},
            # keep the pods' DNS names whole (NVIDIA Dynamo's operator sets the same)
            {"name": "OMPI_MCA_orte_keep_fqdn_hostnames", "value": "1"},
        ]
    return out


def image(opts: K8sOptions) -> str:
    """The image the pods run: the repository image when the repository is an
    image layer, else the serving image."""
    if opts.repo_source == "image":
        if not opts.repo_image:
            raise DeployError(
                "--repo-source image needs --repo-image: the image the generated Dockerfile builds",
                "pass --repo-image REGISTRY/NAME:TAG (build and push it from the output folder)",
            )
        return opts.repo_image
    return opts.image


def volumes(
    served: Served, sizing: Sizing, opts: K8sOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pod's volumes and the tritonserver container's mounts of them."""
    shm = {"medium": "Memory", "sizeLimit": gib_quantity(sizing.shm_bytes)}
    vols: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": shm},
        {"name": "repository", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        # the pod's own copy: writable, so the router's rollout state and logs
        # land there (per pod) instead of failing on the read-only volume
        {"name": "repository", "mountPath": REPO_DIR},
    ]
    rollout_vols, rollout_mounts = rollout_k8s.volumes(opts.name)  # the shared rollout state
    vols += rollout_vols
    mounts += rollout_mounts
    if opts.routing_config:
        vols.append({"name": "routing", "configMap": {"name": opts.routing_config}})
    if opts.repo_source == "volume":
        claim = {"claimName": opts.claim, "readOnly": True}
        vols.append({"name": "models", "persistentVolumeClaim": claim})
        mounts.append({"name": "models", "mountPath": opts.models_path, "readOnly": True})
    return vols, mounts


def relocate_container(served: Served, opts: K8sOptions) -> dict[str, Any]:
    """The init container that copies the repository with its paths moved from
    the builder's folder to the mounted volume (``trtspec.deploy.relocate``)."""
    models = {"name": "models", "mountPath": opts.models_path, "readOnly": True}
    command = [
        "python3", "-m", "trtspec.deploy.relocate",
        f"{opts.models_path.rstrip('/')}/{served.repo_rel}", REPO_DIR,
        "--from-root", served.root, "--to-root", opts.models_path,
    ]  # fmt: skip
    if served.repository_hash:
        command += ["--expect-hash", served.repository_hash]
    if opts.routing_config:
        command += ["--routing", f"{ROUTING_DIR}/routing.json"]
    mounts: list[dict[str, Any]] = [{"name": "repository", "mountPath": REPO_DIR}]
    if opts.repo_source == "volume":
        mounts.append(models)
    if opts.routing_config:
        mounts.append({"name": "routing", "mountPath": ROUTING_DIR, "readOnly": True})
    return {
        "name": "relocate",
        "image": image(opts),
        "command": command,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }


def triton_container(
    served: Served, sizing: Sizing, opts: K8sOptions, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    argv = triton_argv(served, sizing, opts)
    command = ["/bin/sh", f"{TOOLS_DIR}/launch.sh", *argv] if sizing.multi_node else argv
    period = 10
    return {
        "name": "tritonserver",
        "image": image(opts),
        "command": command,
        "env": env(sizing, opts),
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT},
            {"name": "grpc", "containerPort": GRPC_PORT},
            {"name": "metrics", "containerPort": METRICS_PORT},
        ],
        # Triton listens only once every model has loaded: the start-up probe
        # allows the loading budget, then liveness and readiness take over.
        "startupProbe": probe("/v2/health/ready", period, -(-sizing.startup_seconds // period), 5),
        "livenessProbe": liveness(),
        "readinessProbe": probe("/v2/health/ready", 5, 3, 3),
        "resources": resources(sizing),
        "securityContext": container_security(),
        "volumeMounts": mounts,
    }


def pod_spec(
    containers: list[dict[str, Any]],
    vols: list[dict[str, Any]],
    served: Served,
    sizing: Sizing,
    opts: K8sOptions,
    **extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": EXIT_TIMEOUT_S + 15,
        "securityContext": pod_security(),
        "initContainers": [relocate_container(served, opts)],
        "containers": containers,
        "volumes": vols,
        **extra,
    }
    if sizing.uses_gpu:
        spec["tolerations"] = [GPU_TOLERATION] if opts.tolerations is None else opts.tolerations
        found = affinity(served, sizing, opts)
        if found is not None:
            spec["affinity"] = found
    return spec
