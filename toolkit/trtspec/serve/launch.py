"""The tritonserver command lines: one server (``server_argv``), and how TP×PP > 1
engines are launched: the choice between TensorRT-LLM's two multi-GPU modes
and their command lines.

Leader mode (``leader_mode_argv``) runs one tritonserver per rank
under ``mpirun``; every rank loads the engine model, so it serves exactly one
engine model. With several engine models (a draft and a target, or one target
per variant) NVIDIA's draft-target guide
(``examples/draft_target_model/README.md``: "``--multi-model`` is necessary if
TP mode is used") uses orchestrator mode instead: one tritonserver under
``mpirun -n 1`` with ``TRTLLM_ORCHESTRATOR=1``; each engine model's executor
spawns its own TP×PP worker processes (``MPI_Comm_spawn`` of the
``executor_worker_path`` binary that every generated engine config names).
The argv and environment follow ``scripts/launch_triton_server.py`` of
tensorrtllm_backend v0.19.0 (``--multi-model`` without
``--disable-spawn-processes``; the CUDA memory pool flags apply to Triton >
24.06, which every supported container is, and cover every GPU the server
sees: ``add_multi_model_config`` loops over ``number_of_gpus()``, the lines of
``nvidia-smi --list-gpus``, since a draft or a second instance may sit on GPUs
beyond the target's TP×PP).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence

LEADER = "leader"
ORCHESTRATOR = "orchestrator"
SINGLE = "single"
# launch_triton_server.py: env for --multi-model with process spawning.
ORCHESTRATOR_ENV = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
# The Python backend's option that gives a server (or a rank) its own shared-memory prefix.
SHM_OPTION = "shm-region-prefix-name="


def launch_mode(world_size: int, engine_models: Sequence[str]) -> str:
    """``single`` for one rank; ``orchestrator`` when several engine models
    share TP×PP > 1 ranks; ``leader`` otherwise."""
    if world_size <= 1:
        return SINGLE
    return ORCHESTRATOR if len(set(engine_models)) > 1 else LEADER


def visible_gpus(env: Mapping[str, str], fallback: int) -> int:
    """How many GPUs a server started with ``env`` sees: the entries of
    ``CUDA_VISIBLE_DEVICES`` when set, else the lines of ``nvidia-smi
    --list-gpus`` (what launch_triton_server.py counts); never fewer than
    ``fallback`` (the ranks the repository needs), which is also the answer
    when neither can be read."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    count = 0
    if cvd is not None and cvd.strip():
        count = len([d for d in cvd.split(",") if d.strip()])
    elif (smi := shutil.which("nvidia-smi", path=env.get("PATH"))) is not None:
        try:
            out = subprocess.run(
                [smi, "--list-gpus"], capture_output=True, text=True, timeout=20, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        count = len([line for line in out.splitlines() if line.strip()])
    return max(count, fallback)


def orchestrator_mode_argv(
    server_argv: Sequence[str], *, gpus: int, mpirun: str = "mpirun"
) -> list[str]:
    """``mpirun -n 1`` around one tritonserver command line (built by
    ``server_argv``) for orchestrator mode; run it with
    ``ORCHESTRATOR_ENV``. ``gpus`` is how many GPUs the spawned workers use:
    each gets a zero-sized CUDA memory pool, as NVIDIA's launcher does for
    every GPU, with pinned memory and peer access off."""
    if gpus < 1:
        raise ValueError("orchestrator mode needs at least one GPU")
    return [
        mpirun, "--allow-run-as-root", "-n", "1", *server_argv,
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        *(f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(gpus)),
    ]  # fmt: skip


def server_argv(
    binary: str | os.PathLike[str],
    repo: str | os.PathLike[str],
    *,
    host: str,
    http_port: int,
    grpc_port: int,
    metrics_port: int,
    backend_dir: str | os.PathLike[str] | None = None,
    models: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The argv of one tritonserver process (pure)."""
    argv = [str(binary), f"--model-repository={repo}"]
    if backend_dir is not None:
        argv.append(f"--backend-directory={backend_dir}")
    argv += [
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
    ]
    if models is not None:
        argv.append("--model-control-mode=explicit")
        argv += [f"--load-model={name}" for name in models]
    argv += list(extra_args)
    return argv


def leader_mode_argv(
    world_size: int,
    repo: str | os.PathLike[str],
    *,
    engine_model: str | Sequence[str],
    http_port: int = 8000,
    grpc_port: int = 8001,
    metrics_port: int = 8002,
    host: str = "127.0.0.1",
    binary: str | os.PathLike[str] = "tritonserver",
    mpirun: str = "mpirun",
    backend_dir: str | os.PathLike[str] | None = None,
    models: Sequence[str] | None = None,
    oversubscribe: bool = False,
    extra_args: Sequence[str] = (),
    shm_prefix: str = "prefix",
    rank0_repo: str | os.PathLike[str] | None = None,
) -> list[str]:
    """The ``mpirun`` command for TP×PP = ``world_size`` in TRT-LLM's leader
    mode: one tritonserver per rank, each with its own Python-backend shared
    memory prefix (``<shm_prefix><rank>_``). Ranks > 0 load only the engine
    model(s) explicitly; they block inside the engine's instance
    initialisation, so sharing the ports with rank 0 never clashes. ``models``
    restricts rank 0 to those models (explicit loading); ``rank0_repo`` serves
    rank 0 from another repository (a view holding only its models)."""
    if world_size < 2:
        raise ValueError("leader mode needs world_size >= 2")
    engines = [engine_model] if isinstance(engine_model, str) else list(engine_model)
    if not engines:
        raise ValueError("leader mode needs at least one engine model for ranks > 0")
    argv = [mpirun, "--allow-run-as-root"]
    if oversubscribe:
        argv.append("--oversubscribe")
    for rank in range(world_size):
        if rank:
            argv.append(":")
        argv += ["-n", "1"]
        served = rank0_repo if rank == 0 and rank0_repo is not None else repo
        argv += server_argv(
            binary, served, host=host, http_port=http_port, grpc_port=grpc_port,
            metrics_port=metrics_port, backend_dir=backend_dir,
            models=models if rank == 0 else engines,
            extra_args=[
                "--disable-auto-complete-config",
                f"--backend-config=python,{SHM_OPTION}{shm_prefix}{rank}_",
                *extra_args,
            ],
        )  # fmt: skip
    return argv
