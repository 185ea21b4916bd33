"""Multi-node instances: when TP×PP exceeds one node's GPUs, one instance is a
LeaderWorkerSet group of TP×PP / GPUs-per-node pods. The leader runs leader
mode's ``mpirun``; it reaches the workers over SSH, as NVIDIA Dynamo's
operator starts TensorRT-LLM across nodes (``backend_trtllm.go``: a key pair
Secret mounted in every pod, ``sshd`` as the container user on port 2222 in
the workers, ``mpirun`` with ``plm_rsh_args`` naming that port and key). No
pod may ``exec`` into another: a compromised leader holds a key that opens
only its own group's workers' sshd, as the same unprivileged user, instead of
``pods/exec`` over the whole namespace; its account may only read and patch
the rollout ConfigMap (``rollout_k8s``), and the workers carry no token.
The scripts come from a ConfigMap; ``sshd`` and ``ssh`` from the serving
image (the project Dockerfile installs them). No Click.
"""

from __future__ import annotations

from typing import Any

from trtspec.deploy import rollout_k8s
from trtspec.deploy.k8s_pod import (
    SSH_DIR,
    SSH_PORT,
    TOOLS_DIR,
    container_security,
    image,
    pod_spec,
    triton_container,
    volumes,
)
from trtspec.deploy.options import ROLE_LABEL, K8sOptions, Served, labels, meta
from trtspec.deploy.sizing import WORKER_SCHEDULING_S, Sizing

LWS_API = "leaderworkerset.x-k8s.io/v1"
SSH_KEY, SSH_PUB = "private.key", "private.key.pub"  # the Secret's keys (Dynamo's names)

_KEYS = f"""mkdir -p "$HOME/.ssh"
cp {SSH_DIR}/{SSH_KEY} "$HOME/.ssh/id_trtspec"
cp {SSH_DIR}/{SSH_PUB} "$HOME/.ssh/authorized_keys"
chmod 700 "$HOME/.ssh"
chmod 600 "$HOME/.ssh/id_trtspec" "$HOME/.ssh/authorized_keys"
"""
# The leader: its key, then every worker's sshd answering (bounded), then mpirun ("$@").
LAUNCH = (
    """#!/bin/sh
set -eu
"""
    + _KEYS
    + f"""deadline=$(( $(date +%s) + {WORKER_SCHEDULING_S} ))
i=1
while [ "$i" -lt "$TRTSPEC_GROUP_SIZE" ]; do
  host="$POD_NAME-$i.$TRTSPEC_SUBDOMAIN"
  until ssh -p {SSH_PORT} -i "$HOME/.ssh/id_trtspec" -o StrictHostKeyChecking=no \\
      -o UserKnownHostsFile=/dev/null -o ConnectTimeout=5 -o BatchMode=yes "$host" true; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "worker $host did not answer on port {SSH_PORT} within {WORKER_SCHEDULING_S} s" >&2
      exit 1
    fi
    echo "waiting for worker $host"; sleep 5
  done
  i=$((i + 1))
done
exec "$@"
"""
)
# A worker: sshd as the container user (host keys in $HOME, no privilege separation).
WORKER = (
    """#!/bin/sh
set -eu
"""
    + _KEYS
    + f"""mkdir -p "$HOME/.ssh/host"
ssh-keygen -q -t ed25519 -N '' -f "$HOME/.ssh/host/ssh_host_ed25519_key"
cat > "$HOME/.ssh/sshd_config" <<EOF
Port {SSH_PORT}
HostKey $HOME/.ssh/host/ssh_host_ed25519_key
PidFile $HOME/.ssh/sshd.pid
AuthorizedKeysFile $HOME/.ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
StrictModes no
AllowTcpForwarding no
X11Forwarding no
EOF
exec /usr/sbin/sshd -D -e -f "$HOME/.ssh/sshd_config"
"""
)


def _env(opts: K8sOptions) -> list[dict[str, Any]]:
    return [
        {"name": "HOME", "value": "/tmp/trtspec-home"},
        {"name": "TRTSPEC_SUBDOMAIN", "value": opts.name},
    ]


def leaderworkerset(
    served: Served, sizing: Sizing, opts: K8sOptions, notes: dict[str, str], *, replicas: bool
) -> dict[str, Any]:
    vols, mounts = volumes(served, sizing, opts)
    tools = {
        "name": "trtspec-launch",
        "configMap": {"name": f"{opts.name}-launch", "defaultMode": 0o755},
    }
    ssh = {"name": "ssh", "secret": {"secretName": opts.ssh_secret, "defaultMode": 0o440}}
    tool_mount = {"name": "trtspec-launch", "mountPath": TOOLS_DIR, "readOnly": True}
    ssh_mount = {"name": "ssh", "mountPath": SSH_DIR, "readOnly": True}
    leader = triton_container(served, sizing, opts, [*mounts, tool_mount, ssh_mount])
    leader["env"] = [*leader["env"], *(e for e in _env(opts) if e["name"] != "HOME")]
    worker = {
        "name": "worker",
        "image": image(opts),
        # mpirun starts this pod's ranks over SSH; the readiness probe is sshd's port
        "command": ["/bin/sh", f"{TOOLS_DIR}/worker.sh"],
        "env": _env(opts),
        "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 10},
        "resources": leader["resources"],
        "securityContext": container_security(),
        "volumeMounts": [*mounts, tool_mount, ssh_mount],
    }
    spec: dict[str, Any] = {
        "startupPolicy": "LeaderCreated",
        "leaderWorkerTemplate": {
            "size": sizing.pods,
            # One rank lost means the MPI job is gone: restart the whole group.
            "restartPolicy": "RecreateGroupOnPodRestart",
            "leaderTemplate": {
                "metadata": {
                    "labels": {**labels(opts.name), ROLE_LABEL: "leader"},
                    "annotations": notes,
                },
                # the leader's router may read and patch the rollout ConfigMap
                "spec": pod_spec(
                    [leader],
                    [*vols, tools, ssh],
                    served,
                    sizing,
                    opts,
                    serviceAccountName=rollout_k8s.account_name(opts.name),
                ),
            },
            "workerTemplate": {
                "metadata": {"labels": {**labels(opts.name), ROLE_LABEL: "worker"}},
                "spec": pod_spec(
                    [worker],
                    [*vols, tools, ssh],
                    served,
                    sizing,
                    opts,
                    automountServiceAccountToken=False,
                ),
            },
        },
    }
    if replicas:
        spec = {"replicas": opts.replicas, **spec}
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": meta(opts.name, opts, annotations=notes),
        "spec": spec,
    }


def launch_configmap(opts: K8sOptions) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(f"{opts.name}-launch", opts),
        "data": {"launch.sh": LAUNCH, "worker.sh": WORKER},
    }
