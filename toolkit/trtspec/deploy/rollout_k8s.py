"""The Kubernetes objects of a rollout on a cluster and of its autoscaler,
which ``deploy.k8s`` adds to the manifests it writes:

- the rollout ConfigMap ``<name>-rollout`` (``artifacts.rollout_kube``), written
  with no data: the routers serve the routing table's start until the first
  change, and a later ``kubectl apply`` of the same manifests never resets a
  rollout under way (apply removes only the keys it once set);
- least privilege for the routers that patch it: a ServiceAccount, and a
  Role whose one rule allows ``get`` and ``patch`` on that ConfigMap by name
  (``resourceNames``) and nothing else, bound to the serving pods' account;
- what the serving container needs to find it: the ConfigMap volume
  (read-only, at ``ROLLOUT_MOUNT``), a scratch ``emptyDir`` for locks, and
  the environment ``artifacts.rollout_kube`` reads;
- the HorizontalPodAutoscaler on a per-pod metric that rises with load
  (default ``router``: the router's ``trtspec_in_flight`` gauge, requests
  it holds now, summed over its series in the pod), its scale-down window
  capped at the API server's limit, and the Prometheus adapter rule that
  serves that metric to the HPA (a ConfigMap holding the rule as the
  adapter's ``config.yaml`` reads it; kubernetes-sigs/prometheus-adapter
  ``docs/config.md`` at commit dce6abfba93a799c43f70e114dd46a468cd104e6:
  ``seriesQuery``, ``resources.overrides``, ``name.matches``/``as``,
  ``metricsQuery`` with ``<<.Series>>``, ``<<.LabelMatchers>>``,
  ``<<.GroupBy>>``).

No Click here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from trtspec.artifacts import rollout_kube
from trtspec.artifacts.rollout_state import DIR_ENV
from trtspec.deploy.sizing import DeployError

ROLLOUT_MOUNT = "/etc/trtspec/rollout"
SCRATCH_MOUNT = "/var/run/trtspec-rollout"
ROLLOUT_VOLUME, SCRATCH_VOLUME = "rollout", "rollout-scratch"
RBAC_API = "rbac.authorization.k8s.io/v1"

# HPA metrics, per pod through the Prometheus adapter: name, the selector
# the HPA passes, and the adapter's query (summed over the pod's series).
HPA_METRICS: dict[str, tuple[str, dict[str, str] | None]] = {
    # requests the router holds now (rollout_metrics SERIES): rises with load
    "router": ("trtspec_in_flight", None),
    # Triton's queue for the router: near 0 while the router hands each
    # request to a thread at once, so it scales only a saturated server
    "queue": ("nv_inference_pending_request_count", {"model": "router"}),
    # TensorRT-LLM's active requests per engine (GPU engines only)
    "inflight": ("nv_trt_llm_request_metrics", {"request_type": "active"}),
}
DEFAULT_HPA_METRIC = "router"
# pkg/apis/autoscaling/validation: MaxStabilizationWindowSeconds
MAX_STABILIZATION_S = 3600
MIN_SCALE_DOWN_S = 300

Meta = Callable[..., dict[str, Any]]  # deploy.k8s._meta bound to the options


def account_name(name: str) -> str:
    return f"{name}-rollout"


def objects(name: str, namespace: str, meta: Meta, serving_account: str) -> list[dict[str, Any]]:
    """The rollout ConfigMap, and the RBAC that lets the serving pods'
    account (``serving_account``; made here when it is ``account_name``)
    read and patch it and nothing else."""
    configmap = rollout_kube.configmap_name(name)
    role = account_name(name)
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta(
                configmap,
                annotations={
                    "trtspec.dev/rollout": "state.json and history.jsonl are written by "
                    "`trtspec rollout --kube` and the routers; this manifest sets none"
                },
            ),
        }
    ]
    if serving_account == account_name(name):
        docs.append({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(role)})
    docs += [
        {
            "apiVersion": RBAC_API,
            "kind": "Role",
            "metadata": meta(role),
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["configmaps"],
                    "resourceNames": [configmap],
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": RBAC_API,
            "kind": "RoleBinding",
            "metadata": meta(role),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": [
                {"kind": "ServiceAccount", "name": serving_account, "namespace": namespace}
            ],
        },
    ]
    return docs


def volumes(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The serving pod's rollout volumes and the container's mounts of them."""
    vols: list[dict[str, Any]] = [
        {"name": ROLLOUT_VOLUME, "configMap": {"name": rollout_kube.configmap_name(name)}},
        {"name": SCRATCH_VOLUME, "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": ROLLOUT_VOLUME, "mountPath": ROLLOUT_MOUNT, "readOnly": True},
        {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT},
    ]
    return vols, mounts


def env(name: str) -> list[dict[str, Any]]:
    """What the router reads to find its rollout (``artifacts.rollout_kube``)."""
    return [
        {"name": DIR_ENV, "value": ROLLOUT_MOUNT},
        {"name": rollout_kube.CONFIGMAP_ENV, "value": rollout_kube.configmap_name(name)},
        {
            "name": rollout_kube.NAMESPACE_ENV,
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": rollout_kube.SCRATCH_ENV, "value": SCRATCH_MOUNT},
    ]


def scale_down_window(startup_seconds: int) -> int:
    """At least the start-up budget (a new pod takes that long to serve: do
    not flap), at most what the API server accepts."""
    return min(MAX_STABILIZATION_S, max(MIN_SCALE_DOWN_S, startup_seconds))


def hpa(
    meta: Meta,
    target: dict[str, str],
    *,
    min_replicas: int,
    max_replicas: int | None,
    metric: str,
    average: float,
    startup_seconds: int,
) -> dict[str, Any]:
    """The HorizontalPodAutoscaler of ``target`` (its scaleTargetRef)."""
    if metric not in HPA_METRICS:
        raise DeployError(
            f"--hpa-metric {metric!r} is not one of {', '.join(HPA_METRICS)}",
            "router: requests in flight at the router; queue: requests waiting in "
            "Triton's router queue; inflight: TRT-LLM active requests",
        )
    if max_replicas is None or max_replicas < min_replicas:
        raise DeployError(
            f"--hpa-max {max_replicas} is below --replicas {min_replicas}",
            "the autoscaler scales between --replicas and --hpa-max",
        )
    series, selector = HPA_METRICS[metric]
    pod_metric: dict[str, Any] = {"name": series}
    if selector:
        pod_metric["selector"] = {"matchLabels": selector}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(target["name"]),
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": pod_metric,
                        "target": {"type": "AverageValue", "averageValue": f"{average:g}"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 60},
                "scaleDown": {"stabilizationWindowSeconds": scale_down_window(startup_seconds)},
            },
        },
    }


def adapter_rule(metric: str) -> dict[str, Any]:
    """The Prometheus adapter rule that serves ``metric`` per pod."""
    series, _ = HPA_METRICS[metric]
    return {
        # the labels a ServiceMonitor's scrape gives every series
        "seriesQuery": f'{series}{{namespace!="",pod!=""}}',
        "resources": {
            "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        },
        "name": {"matches": f"^{series}$", "as": series},
        "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
    }


def adapter_config(name: str, meta: Meta, metric: str) -> dict[str, Any]:
    """The adapter rule as a ConfigMap (``config.yaml``: ``rules:``): for an
    adapter that reads it, or to merge into one's own rules (the helm
    chart's ``rules.custom``)."""
    text = yaml.safe_dump({"rules": [adapter_rule(metric)]}, sort_keys=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(
            f"{name}-adapter-rules",
            annotations={
                "trtspec.dev/prometheus-adapter": "the rule the HorizontalPodAutoscaler's "
                "metric needs; merge it into the Prometheus adapter's rules"
            },
        ),
        "data": {"config.yaml": text},
    }
