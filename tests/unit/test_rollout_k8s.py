"""What ``trtspec deploy k8s`` writes for the rollout on a cluster
(``deploy.rollout_k8s``): the rollout ConfigMap with no data, a Role that
allows get and patch on that one object and nothing else, the serving pod's
volume, mount and environment, and an autoscaler on the router's in-flight
gauge with its Prometheus adapter rule, a scale-down window capped at the
API server's 3,600 s and no replicas in the Deployment it owns. Every object
is checked against the pinned schemas (tests/fixtures/k8s_schemas)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner
from tests.fixtures.k8s_schemas import schema_errors

from trtspec.artifacts import rollout_kube
from trtspec.cli.main import cli
from trtspec.deploy import rollout_k8s
from trtspec.runtime.models.rollout_metrics import SERIES

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "registry.example.com/trtspec:0.1.0-25.12"


def _deploy(tmp_path: Path, *extra: str) -> dict[str, list[dict[str, Any]]]:
    out = tmp_path / "out"
    spec = ROOT / "build_specs" / "qwen2.5-7b.yaml"
    res = CliRunner().invoke(
        cli,
        # the baseline alone (no routing table), on an existing claim
        [
            "deploy",
            "k8s",
            str(spec),
            "--image",
            IMAGE,
            "--out",
            str(out),
            "--name",
            "qwen",
            "--baseline-only",
            "--pvc",
            "models",
            *extra,
        ],
    )
    assert res.exit_code == 0, res.output
    docs = {p.name: list(yaml.safe_load_all(p.read_text())) for p in sorted(out.glob("*.yaml"))}
    for doc in (d for file in docs.values() for d in file):
        assert schema_errors(doc) == [], (doc["kind"], schema_errors(doc))
    return docs


def test_the_rollout_configmap_and_a_role_scoped_to_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    docs = _deploy(tmp_path, "--namespace", "serving")
    configmap, account, role, binding = docs["rollout.yaml"]
    assert configmap["kind"] == "ConfigMap" and configmap["metadata"]["name"] == "qwen-rollout"
    # no data: a re-apply never resets a rollout under way
    assert "data" not in configmap and configmap["metadata"]["namespace"] == "serving"
    assert (account["kind"], account["metadata"]["name"]) == ("ServiceAccount", "qwen-rollout")
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["qwen-rollout"],
            "verbs": ["get", "patch"],
        }
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "qwen-rollout",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "qwen-rollout", "namespace": "serving"}
    ]
    pod = docs["deployment.yaml"][0]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "qwen-rollout"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["rollout"] == {"name": "rollout", "configMap": {"name": "qwen-rollout"}}
    assert volumes["rollout-scratch"] == {"name": "rollout-scratch", "emptyDir": {}}
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["rollout"] == {
        "name": "rollout",
        "mountPath": rollout_k8s.ROLLOUT_MOUNT,
        "readOnly": True,
    }
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env[rollout_kube.CONFIGMAP_ENV]["value"] == "qwen-rollout"
    assert env["TRTSPEC_ROLLOUT_DIR"]["value"] == rollout_k8s.ROLLOUT_MOUNT
    assert env[rollout_kube.NAMESPACE_ENV]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.namespace"}
    }


def test_without_an_autoscaler_the_deployment_keeps_its_replicas(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    docs = _deploy(tmp_path, "--replicas", "3")
    assert docs["deployment.yaml"][0]["spec"]["replicas"] == 3
    assert "hpa.yaml" not in docs and "prometheus-adapter.yaml" not in docs


def test_the_autoscaler_follows_the_routers_in_flight_gauge(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    docs = _deploy(tmp_path, "--replicas", "2", "--hpa-max", "6", "--startup-seconds", "7200")
    # the autoscaler owns the replicas: an apply must not reset its scale
    assert "replicas" not in docs["deployment.yaml"][0]["spec"]
    spec = docs["hpa.yaml"][0]["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
    (metric,) = spec["metrics"]
    assert metric == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "trtspec_in_flight"},
            "target": {"type": "AverageValue", "averageValue": "4"},
        },
    }
    assert "trtspec_in_flight" in SERIES and SERIES["trtspec_in_flight"].kind == "GAUGE"
    # a 7,200 s start-up budget, but the API server refuses a window over 3,600 s
    assert spec["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 3600}
    (adapter,) = docs["prometheus-adapter.yaml"]
    assert adapter["metadata"]["name"] == "qwen-adapter-rules"
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert rules == [
        {
            "seriesQuery": 'trtspec_in_flight{namespace!="",pod!=""}',
            "resources": {
                "overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
            },
            "name": {"matches": "^trtspec_in_flight$", "as": "trtspec_in_flight"},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }
    ]


def test_the_scale_down_window_is_the_budget_within_the_api_servers_limits() -> None:
    assert rollout_k8s.scale_down_window(60) == 300
    assert rollout_k8s.scale_down_window(1800) == 1800
    assert rollout_k8s.scale_down_window(10**6) == rollout_k8s.MAX_STABILIZATION_S == 3600


def test_the_other_metrics_keep_their_selectors(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    docs = _deploy(tmp_path, "--hpa-max", "2", "--hpa-metric", "queue")
    metric = docs["hpa.yaml"][0]["spec"]["metrics"][0]["pods"]["metric"]
    assert metric == {
        "name": "nv_inference_pending_request_count",
        "selector": {"matchLabels": {"model": "router"}},
    }
