"""What `trtspec deploy k8s` writes for a pod, run here against the real
tritonserver: a reference repository (tiny Llama, an n-gram canary on one
route) is copied to another folder standing for the volume and the
builder's folder is removed; the init container's command (from the
generated Deployment) relocates the repository, and the server started with
the container's load list serves the canary route on the variant and the
rest on the baseline."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from click.testing import CliRunner

from tests.fixtures.every_mode import run_plan_steps
from tests.integration.test_repo_served import infer
from trtspec.artifacts.routing import load_routing
from trtspec.cli.main import cli
from trtspec.deploy.options import REPO_DIR
from trtspec.plan import make_plan
from trtspec.repo.assemble import assemble
from trtspec.serve import Server
from trtspec.spec import load_spec

SPEC = """\
name: podded
backend: reference
target: {{model: {target}, family: llama, dtype: float32, max_batch_size: 2,
         max_input_len: 128, max_seq_len: 512, max_num_tokens: 1024}}
variants:
  - {{name: ngram, mode: ngram, max_draft_len: 4, max_matching_ngram_size: 2}}
  - {{name: lookahead, mode: lookahead, window_size: 2, ngram_size: 2, verification_set_size: 2}}
"""
ROUTING = """\
schema_version: 1
default_variant: baseline
routes:
  chat: {variant: ngram, canary_percent: 100, decision: promote}
"""


def test_the_pods_commands_serve_a_relocated_repository(tiny_llama: Path, tmp_path: Path) -> None:
    builder = tmp_path / "builder"
    builder.mkdir()
    target = shutil.copytree(tiny_llama, builder / "models" / "tiny-llama")
    (builder / "spec.yaml").write_text(SPEC.format(target=target), encoding="utf-8")
    (builder / "routing.yaml").write_text(ROUTING, encoding="utf-8")
    spec = load_spec(builder / "spec.yaml")
    plan = make_plan(spec, builder / "engines")
    run_plan_steps(plan)
    table = load_routing(builder / "routing.yaml")
    repo = assemble(spec, plan, builder / "engines", builder / "triton_repo", routing=table)
    volume, out = tmp_path / "volume", tmp_path / "out"
    res = CliRunner().invoke(cli, [
        "deploy", "k8s", str(builder / "spec.yaml"), "--repo", str(repo), "--image", "x/y:1",
        "--models-path", str(volume), "--out", str(out),
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
    pod = yaml.safe_load((out / "deployment.yaml").read_text())["spec"]["template"]["spec"]
    shutil.copytree(builder, volume)
    shutil.rmtree(builder)  # nothing may still point at the builder's folder
    moved = tmp_path / "pod-repository"
    init = [
        sys.executable if a == "python3" else a.replace(REPO_DIR, str(moved))
        for a in pod["initContainers"][0]["command"]
    ]
    done = subprocess.run(init, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    command = pod["containers"][0]["command"]
    assert f"--model-repository={REPO_DIR}" in command
    models = [a.split("=", 1)[1] for a in command if a.startswith("--load-model=")]
    assert "lookahead" not in models  # not routed: not loaded
    server = Server(moved, models=models, log_path=tmp_path / "tritonserver.log")
    server.start(timeout=300)
    try:
        canary = infer(server, "router", "The quick brown fox", route="chat", max_tokens=8)
        rest = infer(server, "router", "The quick brown fox", max_tokens=8)
    finally:
        server.stop()
    assert canary.error is None and rest.error is None, (canary.error, rest.error)
    assert (canary.final["variant"], rest.final["variant"]) == ("ngram", "baseline")
    assert canary.texts and "".join(canary.texts) == "".join(rest.texts)  # greedy: same text
    log = server.log_text()
    assert "Traceback" not in log, log[-4000:]
