"""Multi-GPU launch modes: orchestrator mode (``--multi-model`` in NVIDIA's
``scripts/launch_triton_server.py``, tensorrtllm_backend v0.19.0) for a
repository whose tritonserver loads several engine models at TP×PP > 1, leader
mode for one engine model. Exact argv and environment, plus a real launch
through a stand-in ``mpirun`` that records what it received."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli.main import cli
from trtspec.errors import ServerError
from trtspec.repo import configs
from trtspec.repo.assemble import EXECUTOR_WORKER
from trtspec.serve import (
    ORCHESTRATOR_ENV,
    Server,
    TritonInstall,
    engine_models,
    launch_mode,
    orchestrator_mode_argv,
    variant_models,
)
from trtspec.serve.access import CLOSED_VALUE

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "repo" / "vicuna-7b"
FAKE = TritonInstall(binary=Path("/x/tritonserver"), backend_dir=Path("/x/backends"))
COMMON = [
    "--http-address=127.0.0.1",
    "--http-port=1",
    "--grpc-address=127.0.0.1",
    "--grpc-port=2",
    "--metrics-address=127.0.0.1",
    "--metrics-port=3",
]


@pytest.mark.parametrize(
    ("world_size", "engines", "mode"),
    [
        (1, ["target"], "single"),
        (1, ["draft", "target"], "single"),
        (2, ["target"], "leader"),
        (4, ["target", "target"], "leader"),
        (2, ["draft_x", "target_dte"], "orchestrator"),
        (8, ["a", "b", "c"], "orchestrator"),
    ],
)
def test_launch_mode(world_size: int, engines: list[str], mode: str) -> None:
    assert launch_mode(world_size, engines) == mode


def test_orchestrator_argv_exact() -> None:
    assert orchestrator_mode_argv(["tritonserver", "--model-repository=/r"], gpus=2) == [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "1",
        "tritonserver",
        "--model-repository=/r",
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
    ]
    with pytest.raises(ValueError, match="at least one GPU"):
        orchestrator_mode_argv(["tritonserver"], gpus=0)


def test_whole_repository_at_tp2_is_served_in_orchestrator_mode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # one zero CUDA pool per visible GPU (launch.visible_gpus): two, whatever this machine has
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    engines = engine_models(GOLDEN)
    assert len(engines) == 6
    server = Server(
        GOLDEN,
        install=FAKE,
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        world_size=2,
        engine_models=engines,
        env={"X": "y"},
    )
    assert server.launch_mode == "orchestrator"
    assert server.argv() == [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "1",
        "/x/tritonserver",
        f"--model-repository={GOLDEN}",
        "--backend-directory=/x/backends",
        *COMMON,
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}0_",
        "--http-restricted-api=model-repository,shared-memory,logging,trace:"
        f"Trtspec-Closed={CLOSED_VALUE}",
        "--grpc-restricted-protocol=model-repository,shared-memory,logging,trace:"
        f"Trtspec-Closed={CLOSED_VALUE}",
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
    ]
    assert server.env == {
        "TRTLLM_ORCHESTRATOR": "1",
        "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1",
        "X": "y",
    }
    # Spawned workers are the binary every engine config names.
    for name in engines:
        params = configs.parameters_of(configs.read_config(GOLDEN / name / "config.pbtxt"))
        assert params["executor_worker_path"] == EXECUTOR_WORKER


def test_variant_with_two_engines_uses_orchestrator_mode_one_engine_leader_mode() -> None:
    draft = variant_models(GOLDEN, "draft")
    server = Server(
        GOLDEN,
        install=FAKE,
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        world_size=2,
        models=draft,
        engine_models=engine_models(GOLDEN, draft),
    )
    assert engine_models(GOLDEN, draft) == ["draft_vicuna-68m", "target_dte"]
    argv = server.argv()
    assert server.launch_mode == "orchestrator" and argv.count("/x/tritonserver") == 1
    # the variant's models come from the server's repository view, model control off
    assert f"--model-repository={server.view_dir}" in argv
    assert not [a for a in argv if a.startswith(("--load-model=", "--model-control-mode"))]
    eagle = variant_models(GOLDEN, "eagle")
    server = Server(
        GOLDEN,
        install=FAKE,
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        world_size=2,
        models=eagle,
        engine_models=engine_models(GOLDEN, eagle),
    )
    assert server.launch_mode == "leader"
    argv = server.argv()
    assert argv.count("/x/tritonserver") == 2
    # rank 0 serves the view; rank 1 blocks in the engine's init, loading it explicitly
    assert argv.count(f"--model-repository={server.view_dir}") == 1
    assert [a for a in argv if a.startswith("--load-model=")] == [
        f"--load-model={m}" for m in engine_models(GOLDEN, eagle)
    ]
    assert not set(ORCHESTRATOR_ENV) & set(server.env)


def _stand_in_mpirun(tmp_path: Path) -> Path:
    """A stand-in mpirun that prints what it was started with, then fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mpirun"
    fake.write_text(
        '#!/bin/sh\necho "argv: $*"\n'
        'echo "env: $TRTLLM_ORCHESTRATOR/$TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES"\n'
        "exit 3\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def test_orchestrator_launch_reaches_mpirun_with_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    bin_dir = _stand_in_mpirun(tmp_path)
    repo = tmp_path / "repo"
    shutil.copytree(GOLDEN, repo)
    server = Server(
        repo,
        install=FAKE,
        world_size=2,
        engine_models=engine_models(repo),
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        log_path=tmp_path / "s.log",
    )
    with pytest.raises(ServerError) as err:
        server.start(timeout=20)
    assert err.value.message.startswith("tritonserver exited with code 3 before it was ready")
    log = (tmp_path / "s.log").read_text()
    assert "env: 1/1" in log
    assert "argv: --allow-run-as-root -n 1 /x/tritonserver" in log
    assert not server.running


def test_serve_cli_picks_orchestrator_mode_for_a_multi_engine_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    bin_dir = _stand_in_mpirun(tmp_path)
    binary = bin_dir / "tritonserver"
    binary.write_text("#!/bin/sh\nexit 1\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    repo = tmp_path / "repo"
    shutil.copytree(GOLDEN, repo)
    log = tmp_path / "s.log"
    result = CliRunner().invoke(
        cli,
        [
            "serve",
            str(repo),
            "--world-size",
            "2",
            "--tritonserver",
            str(binary),
            "--log-file",
            str(log),
            "--timeout",
            "20",
            "--http-port",
            "0",
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ],
        env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
    )
    assert result.exit_code == 1, result.output
    assert "\nError: tritonserver exited with code 3 before it was ready" in result.stderr
    assert "Traceback" not in result.stderr
    text = log.read_text()
    assert "env: 1/1" in text
    assert f"argv: --allow-run-as-root -n 1 {binary} --model-repository={repo}" in text
    assert (
        "--enable-peer-access=false --cuda-memory-pool-byte-size=0:0 "
        "--cuda-memory-pool-byte-size=1:0" in text
    )
