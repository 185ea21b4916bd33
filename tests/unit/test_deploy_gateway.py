"""`trtspec deploy k8s --gateway`: one pool per variant, each route's canary
share as HTTPRoute weights (validated against the gateway-api v1.3.0 CRD),
each pool's routing table installed by its init container (run here on a
copied volume, and read back with the router's own loader). No cluster."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from tests.fixtures.k8s_schemas import kubectl_apply_reads, schema_errors
from tests.unit.test_deploy_k8s import make_built_repo

from trtspec.artifacts.routing import load_routing
from trtspec.cli.main import cli
from trtspec.deploy.options import REPO_DIR

IMAGE = "registry.example.com/trtspec:0.1.0-25.12"


@pytest.fixture
def built_repo(tmp_path: Path) -> tuple[Path, Path]:
    return make_built_repo(tmp_path)  # routes `chat` to ngram at 25%


def deploy(tmp_path: Path, *args: str) -> tuple[Any, Path]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    res = CliRunner().invoke(cli, ["deploy", "k8s", *args, "--image", IMAGE, "--out", str(out)])
    return res, out


def by_kind(out: Path) -> dict[str, list[dict[str, Any]]]:
    kinds: dict[str, list[dict[str, Any]]] = {}
    for docs in kubectl_apply_reads(out).values():
        for doc in docs:
            assert schema_errors(doc) == [], (doc["kind"], schema_errors(doc))
            kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def test_each_routes_canary_is_weighed_at_the_gateway(built_repo, tmp_path: Path) -> None:
    spec, repo = built_repo
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo), "--gateway", "infra/edge",
                      "--write-secret", "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    kinds = by_kind(out)
    assert sorted(d["metadata"]["name"] for d in kinds["Deployment"]) == [
        "built-baseline", "built-ngram",
    ]  # fmt: skip
    assert sorted(d["metadata"]["name"] for d in kinds["Service"]) == [
        "built-baseline", "built-ngram",
    ]  # fmt: skip
    assert len(kinds["PersistentVolumeClaim"]) == len(kinds["Secret"]) == 1  # shared
    claim = kinds["PersistentVolumeClaim"][0]["metadata"]["name"]
    (job,) = kinds["Job"]
    mounted = [
        v["persistentVolumeClaim"]["claimName"]
        for d in [job, *kinds["Deployment"]]
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert mounted == [claim] * 3  # the populate Job and both pools use the one claim
    assert "through the built-populate Job's pod" in res.stderr
    (route,) = kinds["HTTPRoute"]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "edge",
         "namespace": "infra"},
    ]  # fmt: skip
    assert route["spec"]["rules"] == [
        {
            "matches": [{"headers": [{"type": "Exact", "name": "x-trtspec-route",
                                      "value": "chat"}]}],
            "backendRefs": [
                {"name": "built-ngram", "port": 8000, "weight": 2500},
                {"name": "built-baseline", "port": 8000, "weight": 7500},
            ],
        },
        {"backendRefs": [{"name": "built-baseline", "port": 8000, "weight": 1}]},
    ]  # fmt: skip
    summary = json.loads(res.stdout)
    pools = summary["pools"]
    # the baseline's pool loads only the baseline; the variant's keeps the
    # baseline loaded for the in-pod fallback and max_concurrency spill
    assert "ngram" not in pools["baseline"]["models"]
    assert {"ngram", "baseline"} <= set(pools["ngram"]["models"])
    chat = pools["ngram"]["routing"]["routes"]["chat"]
    assert (chat["variant"], chat["canary_percent"], chat["fallback_variant"]) == (
        "ngram", 100.0, "baseline",
    )  # fmt: skip
    assert pools["baseline"]["routing"]["routes"] == {}
    for deployment in kinds["Deployment"]:
        labels = deployment["spec"]["selector"]["matchLabels"]
        service = next(s for s in kinds["Service"]
                       if s["metadata"]["name"] == deployment["metadata"]["name"])  # fmt: skip
        assert service["spec"]["selector"] == labels  # each Service selects its own pool only


def test_a_pools_table_reaches_its_router(built_repo, tmp_path: Path) -> None:
    """The ngram pool's init container, run here: the relocated repository's
    router/routing.json is the pool's table, read back by the router's loader."""
    spec, repo = built_repo
    volume = tmp_path / "volume"
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo), "--gateway", "edge",
                      "--models-path", str(volume))  # fmt: skip
    assert res.exit_code == 0, res.output
    kinds = by_kind(out)
    pod = next(d for d in kinds["Deployment"] if d["metadata"]["name"] == "built-ngram")
    pod_spec = pod["spec"]["template"]["spec"]
    init = pod_spec["initContainers"][0]
    assert {"name": "routing", "configMap": {"name": "built-ngram-routing"}} in pod_spec["volumes"]
    table_doc = next(c for c in kinds["ConfigMap"]
                     if c["metadata"]["name"] == "built-ngram-routing")  # fmt: skip
    shutil.copytree(tmp_path / "triton_repo", volume / "triton_repo")
    shutil.copytree(tmp_path / "engines", volume / "engines")
    (tmp_path / "routing").mkdir()
    (tmp_path / "routing" / "routing.json").write_text(table_doc["data"]["routing.json"])
    moved = tmp_path / "moved"
    argv = [
        sys.executable if a == "python3" else
        a.replace(REPO_DIR, str(moved)).replace("/etc/trtspec/routing", str(tmp_path / "routing"))
        for a in init["command"]
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    table = load_routing(moved / "router" / "routing.json")
    assert table.routes["chat"].variant == "ngram"
    assert table.routes["chat"].canary_percent == 100.0
    # the repository on the volume keeps its own table
    assert load_routing(volume / "triton_repo" / "built" / "router" / "routing.json").routes[
        "chat"].canary_percent == 25.0  # fmt: skip


def test_the_gateway_needs_a_canary(tmp_path: Path, built_repo) -> None:
    spec, _ = built_repo
    res, out = deploy(tmp_path, str(spec), "--gateway", "edge", "--baseline-only",
                      "--pvc", "models")  # fmt: skip
    assert res.exit_code == 1 and not out.exists()
    assert "--gateway with --baseline-only: there is no canary to split" in res.stderr
