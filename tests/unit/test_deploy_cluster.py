"""`trtspec deploy k8s` as a cluster would take it: the output folder holds
only Kubernetes objects; the pods run non-root under the restricted profile,
tolerate GPU nodes and land on GPUs of the architecture the engines were built
for; the repository's paths move to the mounted volume (the init container's
and the populate Job's commands run here, on a copy of the volume); host
memory comes from the memory plan; what cannot work is refused: no common
folder, engines from another TensorRT-LLM, a node size the engines' rank
mapping does not match, variants without a routing table. No cluster."""

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
from tests.unit.test_deploy_k8s import big_spec, make_built_repo

from trtspec.cli.main import cli
from trtspec.deploy.options import REPO_DIR
from trtspec.deploy.relocate import relocate, rewrite_config
from trtspec.deploy.sizing import HOST_BASE_BYTES, HOST_PER_RANK_BYTES
from trtspec.fingerprint import repository_hash
from trtspec.memory import GIB, PROCESS_RESERVE_BYTES

IMAGE = "registry.example.com/trtspec:0.1.0-25.12"


def deploy(tmp_path: Path, *args: str) -> tuple[Any, Path]:
    out = tmp_path / "out"
    shutil.rmtree(out, ignore_errors=True)
    res = CliRunner().invoke(cli, ["deploy", "k8s", *args, "--image", IMAGE, "--out", str(out)])
    return res, out


def objects(out: Path) -> list[dict[str, Any]]:
    docs = [d for docs in kubectl_apply_reads(out).values() for d in docs]
    for doc in docs:
        assert schema_errors(doc) == [], (doc["kind"], schema_errors(doc))
    return docs


def pods(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every pod spec among the objects (Deployment, LeaderWorkerSet, Job)."""
    out = []
    for doc in docs:
        spec = doc.get("spec") or {}
        if "template" in spec:
            out.append(spec["template"]["spec"])
        for key in ("leaderTemplate", "workerTemplate"):
            if key in spec.get("leaderWorkerTemplate", {}):
                out.append(spec["leaderWorkerTemplate"][key]["spec"])
    return out


@pytest.fixture
def built_repo(tmp_path: Path) -> tuple[Path, Path]:
    return make_built_repo(tmp_path)


def record_build(repo: Path, **gpu: Any) -> None:
    """What `trtspec build` writes beside each engine (trtspec.json), for the
    engine folders the repository's configs name."""
    version = gpu.pop("version", "1.1.0")
    for engine in (repo.parent.parent / "engines" / "built").iterdir():
        doc = {"versions": {"tensorrt_llm": version}, "gpu": gpu or None}
        (engine / "trtspec.json").write_text(json.dumps(doc))


# ------------------------------------------------------- what kubectl reads
def test_the_folder_is_what_kubectl_apply_reads_and_the_summary_is_beside_it(
    built_repo, tmp_path: Path
) -> None:
    spec, repo = built_repo
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo), "--format", "json")
    assert res.exit_code == 0, res.output
    docs = objects(out)
    assert sorted(d["kind"] for d in docs) == [
        "ConfigMap", "Deployment", "Job", "PersistentVolumeClaim", "PodDisruptionBudget", "Role",
        "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor",
    ]  # fmt: skip
    # what trtspec decided sits in a subfolder `kubectl apply -f out/` does not enter
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["trtspec"]
    assert json.loads((out / "trtspec" / "deploy.json").read_text())["spec"] == "built"


# -------------------------------------------------------- the pod's security
def test_pods_meet_the_restricted_profile_and_tolerate_gpu_nodes(built_repo, tmp_path) -> None:
    spec, repo = built_repo
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo))
    assert res.exit_code == 0, res.output
    specs = pods(objects(out))
    assert len(specs) == 2  # the Deployment's and the populate Job's
    for pod in specs:
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        }  # fmt: skip
        # the serving pod's token may only read and patch the rollout ConfigMap
        # (rollout_k8s); the populate Job carries none
        if "initContainers" in pod:
            assert pod["serviceAccountName"] == "built-rollout"
        else:
            assert pod["automountServiceAccountToken"] is False
        for c in pod.get("initContainers", []) + pod["containers"]:
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
            }, c["name"]  # fmt: skip
    serving = specs[0]
    assert serving["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    extra = ["--toleration", "pool=h200:NoSchedule", "--toleration", "gpu:NoExecute"]
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo), *extra)
    assert res.exit_code == 0, res.output
    assert pods(objects(out))[0]["tolerations"] == [
        {"key": "pool", "operator": "Equal", "value": "h200", "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
    ]
    res, _ = deploy(tmp_path, str(spec), "--repo", str(repo), "--toleration", "pool=h200")
    assert res.exit_code == 2 and "write KEY[=VALUE]:EFFECT" in res.output


# ------------------------------------------------- GPU architecture, version
def test_node_affinity_follows_the_gpu_the_engines_were_built_on(built_repo, tmp_path) -> None:
    spec, repo = built_repo
    record_build(repo, name="NVIDIA H200", compute_capability="9.0")
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo))
    assert res.exit_code == 0, res.output
    serving = pods(objects(out))[0]
    assert serving["affinity"] == {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["9"]},
                {"key": "nvidia.com/gpu.compute.minor", "operator": "In", "values": ["0"]},
            ]}
        ]}}
    }  # fmt: skip
    assert "GPU architecture is unknown" not in res.stderr
    # engines from two GPU types cannot share one pod
    engine = repo.parent.parent / "engines" / "built" / "target_dte"
    (engine / "trtspec.json").write_text(json.dumps({"gpu": {"compute_capability": "8.0"}}))
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo))
    assert res.exit_code == 1 and not out.exists()
    assert "built on GPUs of different compute capabilities (8.0, 9.0)" in res.stderr
    # --compute-capability decides when the build did not record it (or to override)
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo), "--compute-capability", "10.0")
    assert res.exit_code == 0, res.output
    terms = pods(objects(out))[0]["affinity"]["nodeAffinity"]
    values = [t["values"] for t in terms["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]]  # fmt: skip
    assert values == [["10"], ["0"]]
    res, _ = deploy(tmp_path, str(spec), "--repo", str(repo), "--compute-capability", "sm90")
    assert res.exit_code == 1 and "compute capability 'sm90' is not MAJOR.MINOR" in res.stderr


def test_engines_from_another_tensorrt_llm_are_refused(built_repo, tmp_path) -> None:
    spec, repo = built_repo
    record_build(repo, version="1.0.0", compute_capability="9.0")
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo))
    assert res.exit_code == 1 and not out.exists()
    assert res.stderr.splitlines()[-2:] == [
        "Error: the served engines were built with TensorRT-LLM 1.0.0, but "
        "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 ships 1.1.0",
        "Hint: rebuild the engines in the image the pods run (stack.triton_image), or pin "
        "stack.triton_image to the container that built them",
    ]


def test_gpus_per_node_must_match_the_engines_rank_mapping(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    res, out = deploy(tmp_path, str(spec), "--gpus-per-node", "4", "--pvc-size", "1Ti")
    assert res.exit_code == 1 and not out.exists()
    assert res.stderr.splitlines()[-2:] == [
        "Error: --gpus-per-node 4, but the engines were built for 8 GPUs per node (their rank "
        "mapping: rank r runs on GPU r mod 8 of its node); trtllm-build's default, since the "
        "engines' config.json is not on this machine",
        "Hint: use nodes of 8 GPUs (--gpus-per-node 8), or rebuild the engines with "
        "trtllm-build --gpus_per_node 4",
    ]
    # engines built for 4 per node (their config.json says so) deploy on 4-GPU nodes
    engine = tmp_path / "engines" / "big" / "target"
    engine.mkdir(parents=True)
    mapping = {"world_size": 8, "tp_size": 8, "pp_size": 1, "gpus_per_node": 4}
    (engine / "config.json").write_text(json.dumps({"pretrained_config": {"mapping": mapping}}))
    res, out = deploy(tmp_path, str(spec), "--gpus-per-node", "4", "--pvc-size", "1Ti",
                      "--format", "json")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["sizing"]["pods_per_instance"] == 2


# ------------------------------------------------------ memory, disruptions
def test_host_memory_comes_from_the_memory_plan(tmp_path: Path, monkeypatch) -> None:
    from trtspec.memory import memory_plan
    from trtspec.plan import make_plan
    from trtspec.spec import load_spec

    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    res, out = deploy(tmp_path, str(spec), "--gpu-memory", "141GB", "--format", "json")
    assert res.exit_code == 0, res.output
    sizing = json.loads(res.stdout)["sizing"]
    loaded = load_spec(spec)
    target = memory_plan(loaded, make_plan(loaded, tmp_path / "engines")).engine("target")
    # each of the 8 ranks reads its share of the engine (weights and overhead per
    # GPU) into host memory, beside its process; plus tritonserver and the stubs
    host = HOST_BASE_BYTES + 8 * (HOST_PER_RANK_BYTES + target.fixed)
    assert sizing["host_memory_bytes_per_pod"] == host
    assert 17 * GIB < target.fixed < 18 * GIB  # 70B bf16 at TP 8 (docs/guide/deploy.md's table)
    docs = objects(out)
    pod = pods(docs)[0]
    c = pod["containers"][0]
    shm = 2 * GIB + 8 * GIB  # /dev/shm: 2 GiB and 1 GiB per rank, paid from the pod's memory
    assert c["resources"]["requests"]["memory"] == f"{-(-host // GIB)}Gi"
    assert c["resources"]["limits"]["memory"] == f"{-(-(host + shm) // GIB)}Gi"
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "10Gi"}
    # no repository built here: the claim holds every rank's share, plus 20%
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    data = (PROCESS_RESERVE_BYTES + target.fixed) * 8
    assert claim["spec"] == {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": f"{-(-int(data * 1.2) // GIB)}Gi"}},
    }


def test_disruption_budget_and_update_strategy_follow_the_replicas(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    for replicas, allowed, rolling in (
        ("1", 0, {"maxSurge": 1, "maxUnavailable": 0}),
        ("3", 1, {"maxSurge": 0, "maxUnavailable": 1}),
    ):
        res, out = deploy(tmp_path, str(spec), "--replicas", replicas, "--pvc", "models")
        assert res.exit_code == 0, res.output
        docs = objects(out)
        pdb = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
        deployment = next(d for d in docs if d["kind"] == "Deployment")
        assert pdb["spec"]["maxUnavailable"] == allowed
        assert (
            pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
        )
        assert deployment["spec"]["strategy"]["rollingUpdate"] == rolling
        assert deployment["spec"]["replicas"] == int(replicas)
        assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]  # --pvc: theirs


def test_servicemonitor_labels_and_a_capped_scale_down_window(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    res, out = deploy(tmp_path, str(spec), "--pvc", "models", "--monitor-label",
                      "release=kube-prometheus-stack", "--hpa-max", "4",
                      "--startup-seconds", "7200")  # fmt: skip
    assert res.exit_code == 0, res.output
    docs = objects(out)
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert "ServiceMonitor carries only the app labels" not in res.stderr
    hpa = next(d for d in docs if d["kind"] == "HorizontalPodAutoscaler")
    # autoscaling/v2 refuses a window above 3600 s; the start-up budget is 7200 s
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 3600
    res, _ = deploy(tmp_path, str(spec), "--pvc", "models", "--monitor-label", "release")
    assert res.exit_code == 2 and "write KEY=VALUE" in res.output


# -------------------------------------------------- the repository, relocated
def test_the_volume_needs_a_common_folder(tmp_path: Path) -> None:
    from trtspec.deploy.inputs import served_from
    from trtspec.deploy.sizing import DeployError
    from trtspec.plan import make_plan
    from trtspec.spec import load_spec

    spec = load_spec(big_spec(tmp_path, tp=8))
    plan = make_plan(spec, tmp_path / "engines")
    with pytest.raises(DeployError) as err:
        served_from(spec, plan, repo=None, routing_file=None, repo_root=Path("/var/elsewhere"))
    assert "share no folder but /, so no one volume can hold them" in str(err.value)
    assert "build the engines and the repository under one folder" in err.value.hint


def test_the_pods_commands_relocate_a_copied_volume(built_repo, tmp_path: Path) -> None:
    """The populate Job's command and the init container's, run here: the
    builder's folder copied to another place stands for the volume, the
    models path pointing there."""
    spec, repo = built_repo
    volume = tmp_path / "volume"
    res, out = deploy(tmp_path, str(spec), "--repo", str(repo), "--models-path", str(volume))
    assert res.exit_code == 0, res.output
    docs = objects(out)
    job = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0]
    init = pods(docs)[0]["initContainers"][0]["command"]
    shutil.copytree(tmp_path / "triton_repo", volume / "triton_repo")
    shutil.copytree(tmp_path / "engines", volume / "engines")
    moved = tmp_path / "moved"
    argv = [a.replace(REPO_DIR, str(moved)) for a in job["command"]]
    assert argv[:2] == ["/bin/sh", "-c"]
    (volume / ".trtspec-populated").touch()
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    argv = [a if a != "python3" else sys.executable for a in argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
    assert done.returncode == 0, done.stderr
    config = (moved / "target" / "config.pbtxt").read_text()
    assert f'"{volume}/engines/built/target"' in config and str(tmp_path) + "/engines" not in config
    assert (
        f'"{volume}/engines/built/target/tokenizer"'
        in (moved / "preprocessing" / "config.pbtxt").read_text()
    )
    # with the builder's engines gone, the moved repository is whole: every
    # engine and tokenizer folder it names is on the volume (`trtspec repo --check`)
    from trtspec.repo.check import check_repository

    shutil.rmtree(tmp_path / "engines")
    assert [str(p) for p in check_repository(moved)] == []
    assert check_repository(repo) != []  # the builder's copy now names missing folders
    # the init container refuses a volume holding another build
    (volume / "triton_repo" / "built" / "router" / "1" / "model.py").write_text("# changed\n")
    argv = [
        sys.executable if a == "python3" else a.replace(REPO_DIR, str(tmp_path / "m2"))
        for a in init
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert (
        f"repository fingerprint {repository_hash(volume / 'triton_repo' / 'built')}" in done.stderr
    )
    assert f"deployment was made from {repository_hash(repo)}" in done.stderr


def test_relocation_moves_only_paths_under_the_old_root(tmp_path: Path) -> None:
    text = (
        'parameters { key: "gpt_model_path" value: { string_value: "/srv/a/engines/t" } }\n'
        'parameters { key: "executor_worker_path" value: { string_value: '
        '"/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker" } }\n'
        'parameters { key: "x" value: { string_value: "/srv/ab/c" } }\n'
    )
    moved, changed = rewrite_config(text, "/srv/a", "/models")
    assert changed == ["/srv/a/engines/t"]
    assert '"/models/engines/t"' in moved
    assert "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker" in moved
    assert '"/srv/ab/c"' in moved  # a sibling folder, not under /srv/a
    repo = tmp_path / "repo" / "m"
    repo.mkdir(parents=True)
    (repo / "config.pbtxt").write_text(text)
    from trtspec.deploy.relocate import RelocateError

    with pytest.raises(RelocateError) as err:
        relocate(tmp_path / "repo", tmp_path / "out", "/srv/a", str(tmp_path / "vol"))
    assert f"m/config.pbtxt: /srv/a/engines/t (looked in {tmp_path}/vol/engines/t)" in str(
        err.value
    )
