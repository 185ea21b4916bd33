"""`trtspec deploy k8s`: every generated manifest validated against the pinned
schemas (tests/data/deploy_schemas/README.md: Kubernetes v1.33.0, lws v0.10.0,
prometheus-operator v0.93.0); the pod command equal to what `trtspec serve`
builds; the LeaderWorkerSet leader starting TP×PP ranks over its group; sizes
from the memory plan; every refusal before anything is written; a built
repository's load list, fingerprint and image layer. No cluster, no server."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from tests.fixtures.k8s_schemas import kubectl_apply_reads, schema_errors

from trtspec.artifacts.routing import RouteRule, RoutingTable
from trtspec.cli.main import cli
from trtspec.deploy.k8s_multinode import LAUNCH
from trtspec.deploy.k8s_pod import TOOLS_DIR
from trtspec.deploy.options import REPO_DIR
from trtspec.fingerprint import repository_hash
from trtspec.plan import make_plan
from trtspec.repo.assemble import assemble
from trtspec.serve.access import restricted_api_args
from trtspec.serve.launch import (
    ORCHESTRATOR_ENV,
    leader_mode_argv,
    orchestrator_mode_argv,
    server_argv,
)
from trtspec.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
BUILD_SPECS = sorted((ROOT / "build_specs").glob("*.yaml"))
CONFIGS = ROOT / "tests" / "data" / "model_configs"
IMAGE = "registry.example.com/trtspec:0.1.0-25.12"


def rollout_env(name: str) -> list[dict[str, Any]]:
    """What every serving container gets to find its deployment's rollout ConfigMap."""
    return [
        {"name": "TRTSPEC_ROLLOUT_DIR", "value": "/etc/trtspec/rollout"},
        {"name": "TRTSPEC_ROLLOUT_CONFIGMAP", "value": f"{name}-rollout"},
        {
            "name": "TRTSPEC_ROLLOUT_NAMESPACE",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        },
        {"name": "TRTSPEC_ROLLOUT_SCRATCH", "value": "/var/run/trtspec-rollout"},
    ]


KEY_ARGS = restricted_api_args("$(TRTSPEC_ADMIN_KEY)")
PORTS = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002}


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli, list(args))


def load_dir(out: Path) -> dict[str, list[dict[str, Any]]]:
    """What `kubectl apply -f out` reads (only Kubernetes objects, or it fails)."""
    return kubectl_apply_reads(out)


def summary_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "trtspec" / "deploy.json").read_text())


def all_docs(out: Path) -> list[dict[str, Any]]:
    return [d for docs in load_dir(out).values() for d in docs]


def assert_valid(out: Path) -> None:
    docs = all_docs(out)
    assert docs
    for doc in docs:
        assert schema_errors(doc) == [], (doc["kind"], schema_errors(doc))


def container(out: Path) -> dict[str, Any]:
    docs = load_dir(out)
    if "deployment.yaml" in docs:
        return docs["deployment.yaml"][0]["spec"]["template"]["spec"]["containers"][0]
    lws = docs["leaderworkerset.yaml"][0]
    return lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]


# ------------------------------------------------------------- validator bites
def test_the_validator_refuses_what_a_server_would() -> None:
    good = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 8000, "targetPort": "http"}]},
    }
    assert schema_errors(good) == []
    typo = {**good, "spec": {"portz": []}}
    assert schema_errors(typo) == [
        "spec: Additional properties are not allowed ('portz' was unexpected)"
    ]
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "x"},
        "spec": {"leaderWorkerTemplate": {"size": "2", "workerTemplate": {"spec": {}}}},
    }
    errors = schema_errors(lws)
    assert "spec/leaderWorkerTemplate/size: '2' is not of type 'integer'" in errors
    assert (
        "spec/leaderWorkerTemplate/workerTemplate/spec: 'containers' is a required property"
        in errors
    )
    assert schema_errors({"apiVersion": "v9", "kind": "Nope"}) == [
        "no pinned schema for ('v9', 'Nope')"
    ]


# ---------------------------------------------------------- every build spec
@pytest.mark.parametrize("spec_path", BUILD_SPECS, ids=lambda p: p.stem)
def test_every_build_spec_deploys_with_valid_manifests(
    spec_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a copy, beside the local model folder demo-cpu names (made by `make demo`)
    shutil.copytree(ROOT / "build_specs", tmp_path / "build_specs")
    model = tmp_path / ".cache" / "models" / "smollm2-135m-instruct"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    spec_path = tmp_path / "build_specs" / spec_path.name
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    spec = load_spec(spec_path)
    args = ["deploy", "k8s", str(spec_path), "--image", IMAGE, "--out", str(out), "--hpa-max",
            "4", "--write-secret", "--pvc-size", "20Gi", "--format", "json"]  # fmt: skip
    if spec.variants:  # no routing.yaml yet: refused unless the baseline alone is meant
        res = run(*args)
        assert res.exit_code == 1 and not out.exists()
        assert f"Error: spec {spec.name} has variants" in res.stderr
        args.append("--baseline-only")
    res = run(*args)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout)
    assert summary == {**summary_of(out), "out": str(out)}
    assert sorted(p.name for p in out.iterdir()) == [
        "deployment.yaml", "hpa.yaml", "poddisruptionbudget.yaml", "prometheus-adapter.yaml",
        "rollout.yaml", "secret.yaml", "service.yaml", "servicemonitor.yaml", "trtspec",
        "volume.yaml",
    ]  # fmt: skip
    assert_valid(out)
    assert summary["variants"] == ["baseline"]
    assert summary["models"] == ["baseline", "postprocessing", "preprocessing", "router", "target"]
    assert container(out)["command"] == server_argv(
        "tritonserver", REPO_DIR, host="0.0.0.0", models=summary["models"],
        extra_args=["--exit-timeout-secs=45", *KEY_ARGS], **PORTS,
    )  # fmt: skip
    # an autoscaler owns the replicas: an apply must not reset its scale
    assert "replicas" not in load_dir(out)["deployment.yaml"][0]["spec"]
    limits = container(out)["resources"]["limits"]
    if spec.backend.value == "tensorrt_llm":
        assert limits["nvidia.com/gpu"] == "1"
        assert summary["triton_image"] == spec.stack.triton_image
    else:
        assert "nvidia.com/gpu" not in limits
    assert (out / "secret.yaml").stat().st_mode & 0o777 == 0o600


def test_probes_key_and_service_follow_triton(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    spec = ROOT / "build_specs" / "qwen2.5-7b.yaml"
    res = run("deploy", "k8s", str(spec), "--image", IMAGE, "--out", str(out), "--baseline-only",
              "--pvc-size", "40Gi")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert (
        res.stderr.splitlines()[-8:]
        == [
            "Note: memory plan unknown (a model's config.json is not on this machine): GPU fit "
            "not checked, start-up budget is the default",
            "Note: no --gpu-memory given: GPU fit not checked",
            "Note: the engines' GPU architecture is unknown (not built on this machine, or built "
            "before trtspec recorded it): no GPU node affinity; pass --compute-capability "
            "MAJOR.MINOR of the GPUs that built them",
            "Note: the ServiceMonitor carries only the app labels: Prometheus Operator installs "
            "select ServiceMonitors by label (kube-prometheus-stack: release=<its Helm release>); "
            "pass --monitor-label KEY=VALUE",
            "Note: one replica: its PodDisruptionBudget allows no eviction (a node drain waits), "
            "and an update needs one instance's GPUs free for the new pod",
            f"Note: copy {tmp_path}/ onto the claim qwen2-5-7b-models through the "
            "qwen2-5-7b-populate Job's pod, then touch .trtspec-populated there",
            f"Wrote {out}/ (10 resources)",
        ][-8:]
    )
    c = container(out)
    assert c["startupProbe"] == {
        "httpGet": {"path": "/v2/health/ready", "port": "http"},
        "periodSeconds": 10,
        "failureThreshold": 180,  # the 1800 s default budget when the plan is unknown
        "timeoutSeconds": 5,
    }
    # liveness: Triton's live endpoint and the stubs' heartbeats (a deadlocked
    # router stub leaves Triton "live"; tests/unit/test_heartbeat.py runs the command)
    assert c["livenessProbe"] == {
        "exec": {
            "command": [
                "python3",
                "-m",
                "trtspec.runtime.heartbeat",
                "/tmp/trtspec-heartbeat",
                "--live-url",
                "http://127.0.0.1:8000/v2/health/live",
            ]
        },
        "periodSeconds": 15,
        "failureThreshold": 4,
        "timeoutSeconds": 5,
    }
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["env"] == [
        {
            "name": "TRTSPEC_ADMIN_KEY",
            "valueFrom": {"secretKeyRef": {"name": "qwen2-5-7b-admin", "key": "admin-key"}},
        },
        {"name": "TRTSPEC_HEARTBEAT_DIR", "value": "/tmp/trtspec-heartbeat"},
        *rollout_env("qwen2-5-7b"),
    ]
    service = load_dir(out)["service.yaml"][0]
    assert [p["name"] for p in service["spec"]["ports"]] == ["http", "grpc", "metrics"]
    monitor = load_dir(out)["servicemonitor.yaml"][0]
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]


# ------------------------------------------------- a spec whose plan is known
SPEC = """\
name: big
stack: {{trtllm_version: "1.1.0"}}
target: {{model: ./llama70b, family: llama, dtype: bfloat16, tp: {tp}, pp: {pp},
         max_batch_size: 16, max_input_len: 4096, max_seq_len: 8192, max_num_tokens: 8192}}
variants:
{variants}
"""
DRAFT = """\
  - {name: draft, mode: draft_model, draft: {model: ./llama8b, family: llama, dtype: bfloat16},
     max_draft_len: 4, num_draft_tokens: [4]}
"""


def big_spec(folder: Path, tp: int, pp: int = 1, draft: bool = False) -> Path:
    for name, cfg in (("llama70b", "llama-3.1-70b-instruct"), ("llama8b", "llama-3.1-8b-instruct")):
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / "config.json").write_text((CONFIGS / f"{cfg}.json").read_text())
    path = folder / "big.yaml"
    body = SPEC.format(tp=tp, pp=pp, variants=DRAFT if draft else "  []")
    path.write_text(body.replace("variants:\n  []", "variants: []"), encoding="utf-8")
    return path


def routing_to(folder: Path, variant: str) -> Path:
    path = folder / "routing.yaml"
    route = {"variant": variant, "canary_percent": 10, "decision": "promote"}
    table = {"schema_version": 1, "default_variant": "baseline", "routes": {"chat": route}}
    path.write_text(yaml.safe_dump(table), encoding="utf-8")
    return path


def test_tp_pp_beyond_a_node_makes_a_leaderworkerset(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    spec = big_spec(tmp_path, tp=8, pp=2)
    res = run(
        "deploy", "k8s", str(spec), "--image", IMAGE, "--out", str(out), "--gpus-per-node", "8",
        "--gpu-memory", "141GB", "--replicas", "2", "--hpa-max", "3", "--hpa-metric", "inflight",
        "--write-secret", "--format", "json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert sorted(load_dir(out)) == [
        "configmap.yaml", "hpa.yaml", "leaderworkerset.yaml", "poddisruptionbudget.yaml",
        "prometheus-adapter.yaml", "rollout.yaml", "secret.yaml", "service.yaml",
        "servicemonitor.yaml", "volume.yaml",
    ]  # fmt: skip
    assert_valid(out)
    lws = load_dir(out)["leaderworkerset.yaml"][0]
    group = lws["spec"]["leaderWorkerTemplate"]
    assert "replicas" not in lws["spec"]  # the autoscaler owns them
    assert group["size"] == 2
    command = container(out)["command"]
    # the leader waits for its worker's sshd, then mpirun starts 16 ranks, 8 on each pod
    assert command[:2] == ["/bin/sh", f"{TOOLS_DIR}/launch.sh"]
    mpirun = command[2:]
    ssh = (
        "-p 2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-i $(HOME)/.ssh/id_trtspec"
    )
    assert mpirun[:12] == [
        "mpirun", "--allow-run-as-root", "--host", "$(POD_NAME).big:8,$(POD_NAME)-1.big:8",
        "--mca", "plm_rsh_args", ssh, "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x",
    ]  # fmt: skip
    assert sum(1 for pair in itertools.pairwise(mpirun) if pair == ("-n", "1")) == 16
    expected = leader_mode_argv(
        16, REPO_DIR, engine_model=["target"], host="0.0.0.0", binary="tritonserver",
        models=["baseline", "postprocessing", "preprocessing", "router", "target"],
        extra_args=["--exit-timeout-secs=45", *KEY_ARGS], **PORTS,
    )  # fmt: skip
    assert mpirun[:2] + mpirun[13:] == expected
    leader = group["leaderTemplate"]["spec"]
    worker_spec = group["workerTemplate"]["spec"]
    worker = worker_spec["containers"][0]
    assert leader["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert worker["command"] == ["/bin/sh", f"{TOOLS_DIR}/worker.sh"]
    assert worker["readinessProbe"]["tcpSocket"] == {"port": 2222}
    # no pod may exec into another: no service account token, no RBAC at all
    # the leader's account may read and patch the rollout ConfigMap and nothing else
    # (no pods/exec: no pod may exec into another); the workers carry no token
    assert leader["serviceAccountName"] == "big-rollout"
    assert worker_spec["automountServiceAccountToken"] is False
    roles = [d for d in all_docs(out) if d["kind"] == "Role"]
    assert [r["rules"] for r in roles] == [[{
        "apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["big-rollout"],
        "verbs": ["get", "patch"],
    }]]  # fmt: skip
    binding = next(d for d in load_dir(out)["rollout.yaml"] if d["kind"] == "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "big-rollout", "namespace": "default"}
    ]
    for pod in (leader, worker_spec):  # both move the repository's paths before serving
        assert [c["name"] for c in pod["initContainers"]] == ["relocate"]
        ssh_volume = next(v for v in pod["volumes"] if v["name"] == "ssh")
        assert ssh_volume["secret"]["secretName"] == "big-ssh"
    service = load_dir(out)["service.yaml"][0]
    assert service["spec"]["selector"]["trtspec.dev/role"] == "leader"
    hpa = load_dir(out)["hpa.yaml"][0]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "big",
    }  # fmt: skip
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "nv_trt_llm_request_metrics"
    summary = json.loads(res.stdout)["sizing"]
    assert (summary["pods_per_instance"], summary["gpus_per_instance"]) == (2, 16)
    assert summary["verdict"] == "fits"
    # loading (300 s + 8.2 GiB per GPU at 200 MiB/s, in whole minutes: 360 s) and
    # scheduling the worker pods (300 s)
    assert summary["startup_seconds"] == 360 + 300
    # sshd and ssh come with the serving image itself (the project Dockerfile)
    assert not (out / "Dockerfile").exists()
    assert "openssh-server" in (ROOT / "Dockerfile").read_text()


def test_launch_script_waits_for_every_worker_then_runs_mpirun(tmp_path: Path) -> None:
    """launch.sh as the leader runs it, with an `ssh` on PATH that records its
    calls: worker -2's sshd answers on the second try, -1's at once."""
    from trtspec.deploy.k8s_pod import SSH_DIR

    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "private.key").write_text("private")
    (keys / "private.key.pub").write_text("public")
    bin_dir, log, seen = tmp_path / "bin", tmp_path / "calls", tmp_path / "seen"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(
        f'#!/bin/sh\necho "$@" >> {log}\n'
        f'case "$*" in *g-0-2.g*) if [ ! -f {seen} ]; then touch {seen}; exit 255; fi;; esac\n'
    )
    os.chmod(bin_dir / "ssh", 0o755)
    script = tmp_path / "launch.sh"
    script.write_text(LAUNCH.replace(SSH_DIR, str(keys)).replace("sleep 5", "sleep 0"))
    home = tmp_path / "home"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(home),
           "TRTSPEC_GROUP_SIZE": "3", "POD_NAME": "g-0", "TRTSPEC_SUBDOMAIN": "g"}  # fmt: skip
    done = subprocess.run(
        ["/bin/sh", str(script), "echo", "mpirun", "started"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == ["waiting for worker g-0-2.g", "mpirun started"]
    calls = log.read_text().splitlines()
    assert [c.split()[-2] for c in calls] == ["g-0-1.g", "g-0-2.g", "g-0-2.g"]
    assert calls[0].startswith(f"-p 2222 -i {home}/.ssh/id_trtspec -o StrictHostKeyChecking=no")
    assert (home / ".ssh" / "id_trtspec").read_text() == "private"
    assert (home / ".ssh" / "id_trtspec").stat().st_mode & 0o777 == 0o600
    # a worker that never answers ends the leader (the group is then recreated)
    seen.unlink()
    bounded = script.read_text().replace("+ 300 ))", "+ 0 ))")
    script.write_text(bounded)
    failed = subprocess.run(["/bin/sh", str(script), "true"], env=env, capture_output=True,
                            text=True, timeout=30, check=False)  # fmt: skip
    assert failed.returncode == 1
    assert "worker g-0-2.g did not answer on port 2222 within 300 s" in failed.stderr


def test_several_engines_on_one_node_use_orchestrator_mode(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    spec = big_spec(tmp_path, tp=8, draft=True)
    routing = routing_to(tmp_path, "draft")
    res = run(
        "deploy", "k8s", str(spec), "--image", IMAGE, "--out", str(out), "--routing",
        str(routing), "--gpu-memory", "141GB", "--format", "json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert_valid(out)
    summary = json.loads(res.stdout)
    assert summary["variants"] == ["baseline", "draft"]
    engines = ["draft_llama8b", "target", "target_dte"]
    assert summary["sizing"]["engines"] == engines
    c = container(out)
    one = server_argv(
        "tritonserver", REPO_DIR, host="0.0.0.0",
        models=sorted(["baseline", "draft", "postprocessing", "preprocessing", "router", *engines]),
        extra_args=["--disable-auto-complete-config",
                    "--backend-config=python,shm-region-prefix-name=prefix0_",
                    "--exit-timeout-secs=45", *KEY_ARGS],
        **PORTS,
    )  # fmt: skip
    assert c["command"] == orchestrator_mode_argv(one, gpus=8)
    assert {e["name"]: e.get("value") for e in c["env"][1:]} == {
        "TRTSPEC_HEARTBEAT_DIR": "/tmp/trtspec-heartbeat",
        **{e["name"]: e.get("value") for e in rollout_env("big")},
        **ORCHESTRATOR_ENV,
    }
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "8"


# ------------------------------------------------------------------ refusals
def refused(tmp_path: Path, *args: str) -> Any:
    out = tmp_path / "out"
    res = run("deploy", "k8s", *args, "--out", str(out))
    assert res.exit_code == 1, res.output
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []
    return res


def test_missing_image_is_refused_before_writing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    res = refused(tmp_path, str(ROOT / "build_specs" / "vicuna-7b.yaml"))
    assert res.stderr.splitlines()[-2:] == [
        "Error: no serving image: the pods need trtspec installed on the pinned Triton image",
        "Hint: build the project Dockerfile with --build-arg "
        "TRITON_IMAGE=nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3 and pass it with --image",
    ]


def test_engines_the_gpu_cannot_hold_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=1)
    res = refused(tmp_path, str(spec), "--image", IMAGE, "--gpu-memory", "141GB")
    assert res.stderr.splitlines()[-2:] == [
        "Error: the 1 engines served (target) need at least 136.8 GiB per GPU at TP×PP = 1, "
        "but a GPU has 131.3 GiB",
        "Hint: raise target.tp (more GPUs per instance), quantize the target, or route fewer "
        "variants (each routed variant loads its own engines on every GPU)",
    ]


def test_ranks_that_do_not_split_into_equal_pods_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    res = refused(tmp_path, str(spec), "--image", IMAGE, "--gpus-per-node", "3")
    assert res.stderr.splitlines()[-2:] == [
        "Error: target.tp × target.pp = 8 ranks cannot be split into pods of --gpus-per-node "
        "3 GPUs (a LeaderWorkerSet group is equal pods)",
        "Hint: use nodes whose GPU count divides 8, or change target.tp/pp",
    ]


def test_several_engines_across_nodes_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8, pp=2, draft=True)
    routing = routing_to(tmp_path, "draft")
    res = refused(tmp_path, str(spec), "--image", IMAGE, "--routing", str(routing))
    assert res.stderr.splitlines()[-2].startswith(
        "Error: the deployment serves 3 engine models (draft_llama8b, target, target_dte) with "
        "TP×PP = 16 ranks over 2 pods: that needs TensorRT-LLM's orchestrator mode"
    )


def test_unknown_routed_variant_and_bad_autoscaler_are_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    res = refused(
        tmp_path, str(spec), "--image", IMAGE, "--routing", str(routing_to(tmp_path, "x"))
    )
    assert (
        f"Error: {tmp_path / 'routing.yaml'}: variant(s) x not in spec big (variants: baseline)"
        in res.stderr
    )
    res = refused(tmp_path, str(spec), "--image", IMAGE, "--replicas", "3", "--hpa-max", "2")
    assert "Error: --hpa-max 2 is below --replicas 3" in res.stderr


def test_a_name_kubernetes_would_refuse_is_refused(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = str(ROOT / "build_specs" / "small-ngram.yaml")
    res = refused(tmp_path, spec, "--image", IMAGE, "--name", "Small_Ngram")
    assert res.stderr.splitlines()[-2:] == [
        "Error: resource name 'Small_Ngram' is not a DNS-1123 label of at most 46 characters",
        "Hint: pass --name with lower-case letters, digits and '-', starting and ending with a "
        "letter or digit",
    ]


def test_an_existing_output_is_kept_unless_forced(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    spec = str(ROOT / "build_specs" / "small-ngram.yaml")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    res = run("deploy", "k8s", spec, "--image", IMAGE, "--out", str(out), "--baseline-only",
              "--pvc", "mine")  # fmt: skip
    assert res.exit_code == 1
    assert res.stderr.splitlines()[-2:] == [
        f"Error: {out} already exists",
        "Hint: pass --force to replace it, or choose another --out",
    ]
    assert (out / "mine.txt").read_text() == "keep"
    res = run("deploy", "k8s", spec, "--image", IMAGE, "--out", str(out), "--force",
              "--baseline-only", "--pvc", "mine")  # fmt: skip
    assert res.exit_code == 0, res.output
    assert not (out / "mine.txt").exists()
    assert (out / "deployment.yaml").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left


# ------------------------------------------------------ a built repository
GPU_SPEC = """\
name: built
stack: {trtllm_version: "1.1.0"}
target: {model: ./llama7b, family: llama, dtype: float16, tp: 2, max_batch_size: 8,
         max_input_len: 2048, max_seq_len: 4096, max_num_tokens: 8192}
variants:
  - {name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 2}
  - {name: lookahead, mode: lookahead, window_size: 4, ngram_size: 3, verification_set_size: 4}
"""


@pytest.fixture
def built_repo(tmp_path: Path) -> tuple[Path, Path]:
    return make_built_repo(tmp_path)


def make_built_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A tensorrt_llm repository assembled by `trtspec.repo` from engine
    folders holding the metadata the assembler reads, routing `chat` to ngram."""
    (tmp_path / "llama7b").mkdir()
    (tmp_path / "llama7b" / "config.json").write_text((CONFIGS / "llama-2-7b-hf.json").read_text())
    spec_path = tmp_path / "built.yaml"
    spec_path.write_text(GPU_SPEC, encoding="utf-8")
    spec = load_spec(spec_path)
    plan = make_plan(spec, tmp_path / "engines")
    for engine in plan.engines:
        (engine.dir / "tokenizer").mkdir(parents=True)
        mode = {"none": 1, "draft_tokens_external": 2, "lookahead_decoding": 8}[engine.mode]
        doc = {
            "version": "1.1.0",
            "pretrained_config": {"architecture": "LlamaForCausalLM",
                                  "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1}},
            "build_config": {"max_draft_len": engine.max_draft_len,
                             "speculative_decoding_mode": mode},
        }  # fmt: skip
        (engine.dir / "config.json").write_text(json.dumps(doc))
        (engine.dir / "rank0.engine").write_bytes(b"\0" * 64)
    table = RoutingTable(routes={"chat": RouteRule("ngram", 4, 25.0, "promote", "baseline")})
    repo = assemble(spec, plan, tmp_path / "engines", tmp_path / "triton_repo", routing=table)
    return spec_path, repo


def test_a_built_repository_gives_the_load_list_paths_and_fingerprint(built_repo, tmp_path) -> None:
    spec_path, repo = built_repo
    out = tmp_path / "out"
    res = run(
        "deploy", "k8s", str(spec_path), "--repo", str(repo), "--image", IMAGE, "--out", str(out),
        "--gpu-memory", "80GiB", "--format", "json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert_valid(out)
    summary = json.loads(res.stdout)
    assert summary["repository_hash"] == repository_hash(repo)
    assert summary["variants"] == ["baseline", "ngram"]  # lookahead is not routed: not loaded
    assert summary["models"] == [
        "baseline", "ngram", "postprocessing", "preprocessing", "router", "target", "target_dte",
    ]  # fmt: skip
    assert summary["routing"]["routes"]["chat"]["canary_percent"] == 25.0
    deployment = load_dir(out)["deployment.yaml"][0]
    notes = deployment["metadata"]["annotations"]
    assert notes["trtspec.dev/repository-hash"] == repository_hash(repo)
    # the volume (the folder holding the repository and the engines) is mounted
    # at /models; an init container copies the repository there with its paths
    # moved, after checking the fingerprint
    mount = next(m for m in container(out)["volumeMounts"] if m["name"] == "models")
    assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}
    # the pod's own copy stays writable: the router keeps its rollout state there
    copy = next(m for m in container(out)["volumeMounts"] if m["name"] == "repository")
    assert copy == {"name": "repository", "mountPath": REPO_DIR}
    assert f"--model-repository={REPO_DIR}" in container(out)["command"]
    init = deployment["spec"]["template"]["spec"]["initContainers"][0]
    assert init["command"] == [
        "python3", "-m", "trtspec.deploy.relocate", "/models/triton_repo/built", REPO_DIR,
        "--from-root", str(tmp_path), "--to-root", "/models",
        "--expect-hash", repository_hash(repo),
    ]  # fmt: skip
    sizing = summary["sizing"]
    assert (sizing["launch"], sizing["gpus_per_pod"], sizing["verdict"]) == (
        "orchestrator",
        2,
        "fits",
    )
    # two 7B engines at TP 2 in fp16: 6.3 GiB of weights each per GPU (plus
    # activations and reserve, 14.1 GiB), so the start-up budget (300 s + that
    # at 200 MiB/s = 372 s, in whole minutes) is 7 minutes
    assert sizing["startup_seconds"] == 420
    assert container(out)["startupProbe"]["failureThreshold"] == 42


def test_a_routing_file_must_match_the_repositorys_router(built_repo, tmp_path) -> None:
    spec_path, repo = built_repo
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"default_variant": "baseline", "routes": {}}))
    res = refused(tmp_path, str(spec_path), "--repo", str(repo), "--image", IMAGE,
                  "--routing", str(other))  # fmt: skip
    assert res.stderr.splitlines()[-2:] == [
        f"Error: {other}: differs from the table the repository's router serves "
        f"({repo / 'router' / 'routing.json'})",
        f"Hint: install it first: trtspec repo {spec_path} --routing {other}",
    ]


def test_repository_as_an_image_layer(built_repo, tmp_path) -> None:
    spec_path, repo = built_repo
    out = tmp_path / "out"
    res = run(
        "deploy", "k8s", str(spec_path), "--repo", str(repo), "--image", IMAGE, "--out", str(out),
        "--repo-source", "image", "--repo-image", "registry.example.com/built-repo:1",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert_valid(out)
    c = container(out)
    assert c["image"] == "registry.example.com/built-repo:1"
    assert [m["name"] for m in c["volumeMounts"]] == [
        "dshm", "repository", "rollout", "rollout-scratch",
    ]  # fmt: skip
    assert "volume.yaml" not in load_dir(out)  # no claim: the image holds the data
    lines = (out / "Dockerfile").read_text().splitlines()
    assert (
        lines[2]
        == f"#   docker build -f Dockerfile -t registry.example.com/built-repo:1 {tmp_path}"
    )
    assert lines[-7:] == [
        f"FROM {IMAGE}",
        f"# The model repository and its engines (repository hash {repository_hash(repo)}),",
        "# at /models as on the volume; the pods move the repository's paths there",
        "COPY --chown=1000:1000 triton_repo/built /models/triton_repo/built",
        "COPY --chown=1000:1000 engines/built/target /models/engines/built/target",
        "COPY --chown=1000:1000 engines/built/target_dte /models/engines/built/target_dte",
        "USER 1000:1000",
    ]
    shutil.rmtree(out)
    res = refused(tmp_path, str(spec_path), "--repo", str(repo), "--image", IMAGE,
                  "--repo-source", "image")  # fmt: skip
    assert "Error: --repo-source image needs --repo-image" in res.stderr


# ------------------------------------------------------------------ capacity
def bench_summary(tmp_path: Path) -> Path:
    """A summary.json made by the benchmark's own summary functions from request
    rows: at 8 in flight the server returned 16 requests of 200 tokens in 2 s."""
    from trtspec.bench.summary import load_throughput, summarize_cell

    rows = [
        {"route": "chat", "variant": v, "concurrency": 8, "temperature": 0.0, "load": "8",
         "send_time_unix": 1000.0 + (i % 8) * 0.01, "latency_ms": 2000.0 - (i % 8) * 10,
         "completion_tokens": 200}
        for i, v in enumerate(["baseline"] * 8 + ["draft"] * 8)
    ]  # fmt: skip
    cells = [
        summarize_cell([r for r in rows if r["variant"] == v], None) for v in ("baseline", "draft")
    ]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"cells": cells, "load_throughput": load_throughput(rows)}))
    return path


def test_rate_and_measured_throughput_set_the_replicas(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    summary = bench_summary(tmp_path)
    spec = big_spec(tmp_path, tp=8)
    out = tmp_path / "out"
    res = run(
        "deploy", "k8s", str(spec), "--image", IMAGE, "--out", str(out), "--gpu-memory", "141GB",
        "--rate", "20", "--throughput-from", str(summary), "--route", "chat", "--level", "8",
        "--format", "json",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    # 3200 tokens in 2 s = 1600 tok/s; / 200 tokens = 8 req/s per instance; 20 req/s -> 3
    assert json.loads(res.stdout)["capacity"] == {
        "rate_rps": 20.0, "per_instance_rps": 8.0, "route": "chat", "level": 8,
        "replicas": 3, "pods": 3, "gpus": 24,
    }  # fmt: skip
    assert load_dir(out)["deployment.yaml"][0]["spec"]["replicas"] == 3
    shutil.rmtree(out)
    res = refused(
        tmp_path, str(spec), "--image", IMAGE, "--rate", "20", "--throughput-from", str(summary),
        "--route", "chat", "--level", "4",
    )  # fmt: skip
    assert res.stderr.splitlines()[-2:] == [
        f"Error: {summary}: no throughput for route 'chat' at concurrency 4 (measured levels: 8)",
        "Hint: pass a route and --level the benchmark measured (spec routes.<name>.concurrency)",
    ]
    res = run("deploy", "k8s", str(spec), "--image", IMAGE, "--rate", "20", "--replicas", "2",
              "--throughput-from", str(summary), "--route", "chat", "--level", "8")  # fmt: skip
    assert res.exit_code == 2
    assert "--rate sets the replicas: leave out --replicas" in res.stderr


# ----------------------------------------------- docs/guide/deploy.md's sizing case
DOC = ROOT / "docs" / "guide" / "deploy.md"


def test_the_documented_sizing_case_is_what_the_memory_plan_says(tmp_path: Path) -> None:
    """docs/guide/deploy.md sizes Llama-3.1-70B + an 8B draft at TP 8 on 141 GB H200
    nodes; every number in its table is recomputed here from the memory plan."""
    from trtspec.deploy.sizing import Capacity, capacity, served_fit, size_instance
    from trtspec.memory import GIB, memory_plan, parse_size

    spec_path = big_spec(tmp_path, tp=8, draft=True)
    # the draft at TP 8 too: at its default TP 1 the 8B draft sits whole on GPU 0
    # (16 GB), and the canary no longer fits a full KV batch there
    text = spec_path.read_text().replace("max_batch_size: 16", "max_batch_size: 64")
    spec_path.write_text(text.replace("dtype: bfloat16}", "dtype: bfloat16, tp: 8}"))
    spec = load_spec(spec_path)
    plan = make_plan(spec, tmp_path / "engines")
    gpu = parse_size("141GB")
    mp = memory_plan(spec, plan, gpu)
    rows = []
    cases = {
        "baseline only": ["target"],
        "baseline + draft canary": ["draft_llama8b_tp8pp1", "target", "target_dte"],
    }
    sizes = {}
    for label, engines in cases.items():
        fit = served_fit(mp, engines, gpu)
        sizes[label] = size_instance(spec, mp, engines, gpus_per_node=8, gpu_bytes=gpu)
        rows.append(
            f"| {label} | {', '.join(engines)} | {sizes[label].launch} | "
            f"{fit.fixed / GIB:.1f} GiB | {fit.need_full / GIB:.1f} GiB | "
            f"{(gpu - fit.fixed) / GIB:.1f} GiB | {sizes[label].startup_seconds} s |"
        )
    from trtspec.deploy.k8s_pod import gib_quantity

    for label, sizing in sizes.items():  # host memory per pod, from the same plan
        rows.append(f"| {label} | {gib_quantity(sizing.host_bytes)} | "
                    f"{gib_quantity(sizing.host_bytes + sizing.shm_bytes)} |")  # fmt: skip
    # request rate -> replicas at the (assumed, stated in the doc) per-instance throughput
    for level, rps in ((8, 4.0), (32, 10.0)):
        cap: Capacity = capacity(sizes["baseline + draft canary"], 60.0, rps)
        rows.append(f"| 60 req/s at {level} in flight | {rps:g} req/s | {cap.replicas} | "
                    f"{cap.pods} | {cap.gpus} |")  # fmt: skip
    doc = DOC.read_text(encoding="utf-8")
    missing = [row for row in rows if row not in doc]
    assert not missing, "docs/guide/deploy.md's sizing table is stale:\n" + "\n".join(rows)
