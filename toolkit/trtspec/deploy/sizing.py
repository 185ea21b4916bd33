"""How big one deployed instance is, from the spec and its GPU memory plan.

One *instance* is one ``tritonserver`` serving the models the routing table
needs (the router, the variants it routes to, their engines): TP×PP ranks,
one GPU each. It runs in one pod when the ranks fit on one node, else in a
group of ``TP×PP / gpus_per_node`` pods (a LeaderWorkerSet group). The GPU
memory each rank needs is the memory plan's (``trtspec.memory``) sum over the
served engines, per GPU of the TP×PP group. Everything that cannot work is
refused here, before a manifest is written: ranks that cannot be split into
equal pods, engines that do not fit one GPU, several engine models across
pods. No Click; ``trtspec.deploy.k8s`` and the CLI call it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trtspec.errors import TrtspecError
from trtspec.memory import GIB, PROCESS_RESERVE_BYTES, Fit, MemoryPlan, gib
from trtspec.serve.launch import ORCHESTRATOR, launch_mode
from trtspec.vocab import gpu_backend

# Start-up budget of one instance: container start, Python models, MPI wire-up,
# then every served engine's weights read from the volume. LOAD_BYTES_PER_S is
# a conservative read rate per GPU (network volumes often give 0.5-2 GB/s); the
# result is rounded up to whole probe periods. An estimate: --startup-seconds overrides.
STARTUP_BASE_S = 300
LOAD_BYTES_PER_S = 200 * 1024**2
# trtllm-build's --gpus_per_node default, which it writes into the engine's rank
# mapping even without auto parallel (NVIDIA/TensorRT-LLM
# tensorrt_llm/commands/build.py @ 008b2b8d: `default=8`, and build_model sets
# `model_config.mapping.gpus_per_node` from it); trtspec does not pass the flag.
TRTLLM_GPUS_PER_NODE = 8
DEFAULT_STARTUP_S = 1800  # when the memory plan cannot size the weights
# Multi-node: the worker pods of a group are scheduled after the leader, on
# other nodes that may first pull the serving image (tens of GB); the leader
# waits for every worker's SSH port before mpirun starts the ranks.
WORKER_SCHEDULING_S = 300
# Host memory of one pod (estimates, stated as such in the docs): TensorRT-LLM
# reads each rank's engine file into host memory before it moves to the GPU, so
# a pod holds up to the served engines' weights of all its ranks at once; plus
# tritonserver and the Python models' stubs (tokenizers, router), and per rank
# its process (CUDA context, MPI, NCCL buffers). /dev/shm (a memory-backed
# emptyDir, counted against the pod's memory) carries the Python backend's
# tensors and NCCL's intra-node buffers.
HOST_BASE_BYTES = 8 * GIB
HOST_PER_RANK_BYTES = 2 * GIB
SHM_BASE_BYTES = 2 * GIB
SHM_PER_RANK_BYTES = 1 * GIB
HOST_UNKNOWN_PER_GPU = 32 * GIB  # when the memory plan cannot size the weights


class DeployError(TrtspecError):
    """A deployment that cannot work as asked (refused before anything is written)."""


@dataclass(frozen=True)
class Sizing:
    """One instance: its ranks, pods and GPU memory per GPU."""

    backend: str
    world_size: int  # TP×PP ranks
    gpus_per_node: int
    launch: str  # single | leader | orchestrator (trtspec.serve.launch)
    engines: list[str]  # engine models the instance loads
    fit: Fit | None  # the memory plan's estimate for those engines (None: unknown)
    startup_seconds: int
    notes: list[str] = field(default_factory=list)

    @property
    def uses_gpu(self) -> bool:
        return gpu_backend(self.backend)

    @property
    def pods(self) -> int:
        """Pods of one instance: 1, or a LeaderWorkerSet group of this size."""
        if not self.uses_gpu or self.world_size <= self.gpus_per_node:
            return 1
        return self.world_size // self.gpus_per_node

    @property
    def gpus_per_pod(self) -> int:
        if not self.uses_gpu:
            return 0
        return min(self.world_size, self.gpus_per_node)

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod

    @property
    def multi_node(self) -> bool:
        return self.pods > 1

    @property
    def shm_bytes(self) -> int:
        return SHM_BASE_BYTES + SHM_PER_RANK_BYTES * max(1, self.gpus_per_pod)

    @property
    def host_bytes(self) -> int:
        """Host memory one pod requests (its limit adds ``shm_bytes``)."""
        ranks = max(1, self.gpus_per_pod)
        fit = self.fit
        if fit is None or not fit.known:
            return HOST_UNKNOWN_PER_GPU * ranks if self.uses_gpu else HOST_BASE_BYTES
        weights = max(0, fit.fixed - PROCESS_RESERVE_BYTES) if self.uses_gpu else 0
        return HOST_BASE_BYTES + ranks * (HOST_PER_RANK_BYTES + weights)

    def to_dict(self) -> dict[str, Any]:
        fit = self.fit
        return {
            "backend": self.backend,
            "world_size": self.world_size,
            "launch": self.launch,
            "pods_per_instance": self.pods,
            "gpus_per_pod": self.gpus_per_pod,
            "gpus_per_instance": self.gpus,
            "engines": self.engines,
            "need_min_bytes_per_gpu": fit.need_min if fit and fit.known else None,
            "need_full_bytes_per_gpu": fit.need_full if fit and fit.known else None,
            "gpu_memory_bytes": fit.gpu if fit else None,
            "verdict": fit.verdict if fit else "unknown",
            "startup_seconds": self.startup_seconds,
            "host_memory_bytes_per_pod": self.host_bytes,
            "shm_bytes_per_pod": self.shm_bytes,
            "notes": self.notes,
        }


def served_fit(mp: MemoryPlan, engines: list[str], gpu_bytes: int | None) -> Fit:
    """The memory plan's estimate for the engines one server loads (the same
    sums ``memory.memory_plan`` makes for a repository or one variant)."""
    members = [mp.engine(name) for name in engines]
    return Fit(
        name="deployment",
        engines=list(engines),
        fixed=PROCESS_RESERVE_BYTES + sum(m.fixed for m in members),
        kv_min=sum(m.kv_min for m in members),
        kv_full=sum(m.kv_full for m in members),
        gpu=gpu_bytes,
        known=all(m.known for m in members),
    )


def startup_seconds(fit: Fit | None) -> int:
    """Seconds to allow for start-up: the base plus the weights per GPU at the
    assumed read rate, in whole minutes (``DEFAULT_STARTUP_S`` when unknown)."""
    if fit is None or not fit.known:
        return DEFAULT_STARTUP_S
    weights = max(0, fit.fixed - PROCESS_RESERVE_BYTES)
    return int(math.ceil((STARTUP_BASE_S + weights / LOAD_BYTES_PER_S) / 60) * 60)


def size_instance(
    spec: Any,
    mp: MemoryPlan | None,
    engines: list[str],
    *,
    gpus_per_node: int,
    gpu_bytes: int | None,
    startup_override: int | None = None,
    engine_gpus_per_node: list[int] | None = None,
) -> Sizing:
    """Size one instance serving ``engines``; ``DeployError`` for what cannot work.
    ``engine_gpus_per_node``: the ``gpus_per_node`` the engines' rank mapping was
    built with (TensorRT-LLM puts rank r on GPU r mod gpus_per_node of its node)."""
    backend = spec.backend.value
    if gpus_per_node < 1:
        raise DeployError(
            f"--gpus-per-node {gpus_per_node}: a node needs at least one GPU for one rank",
            "pass the number of GPUs of one node, e.g. --gpus-per-node 8",
        )
    gpu = spec.backend.gpu
    world = int(spec.target.tp) * int(spec.target.pp) if gpu else 1
    launch = launch_mode(world, engines)
    notes: list[str] = []
    fit = None
    if mp is not None and engines:
        fit = served_fit(mp, engines, gpu_bytes)
    if gpu and world > gpus_per_node:
        if world % gpus_per_node:
            raise DeployError(
                f"target.tp × target.pp = {world} ranks cannot be split into pods of "
                f"--gpus-per-node {gpus_per_node} GPUs (a LeaderWorkerSet group is equal pods)",
                f"use nodes whose GPU count divides {world}, or change target.tp/pp",
            )
        built = sorted(set(engine_gpus_per_node or [])) or [TRTLLM_GPUS_PER_NODE]
        if built != [gpus_per_node]:
            raise DeployError(
                f"--gpus-per-node {gpus_per_node}, but the engines were built for "
                f"{', '.join(map(str, built))} GPUs per node (their rank mapping: rank r runs "
                f"on GPU r mod {built[0]} of its node)"
                + (
                    ""
                    if engine_gpus_per_node
                    else "; trtllm-build's default, since the "
                    "engines' config.json is not on this machine"
                ),
                f"use nodes of {built[0]} GPUs (--gpus-per-node {built[0]}), or rebuild the "
                f"engines with trtllm-build --gpus_per_node {gpus_per_node}",
            )
        if launch == ORCHESTRATOR:
            raise DeployError(
                f"the deployment serves {len(engines)} engine models ({', '.join(engines)}) "
                f"with TP×PP = {world} ranks over {world // gpus_per_node} pods: that needs "
                "TensorRT-LLM's orchestrator mode, whose workers are spawned from one "
                "process on one node; trtspec starts multi-node ranks in leader mode only, "
                "which serves one engine model",
                "route only variants that share one engine (a routing table whose routes "
                "all use one variant), or use nodes with enough GPUs for one instance",
            )
    if gpu and fit is not None and fit.known and fit.verdict == "does not fit":
        raise DeployError(
            f"the {len(engines)} engines served ({', '.join(engines)}) need at least "
            f"{gib(fit.need_min)} per GPU at TP×PP = {world}, but a GPU has "
            f"{gib(fit.gpu or 0)}",
            "raise target.tp (more GPUs per instance), quantize the target, or route fewer "
            "variants (each routed variant loads its own engines on every GPU)",
        )
    if gpu and fit is not None and fit.verdict == "fits, smaller KV cache":
        notes.append(
            f"the engines fit only with {gib((fit.gpu or 0) - fit.fixed)} of KV cache per GPU, "
            f"less than the {gib(fit.kv_full)} a full batch needs: fewer requests in flight"
        )
    if gpu and (fit is None or not fit.known):
        notes.append(
            "memory plan unknown (a model's config.json is not on this machine): GPU fit "
            "not checked, start-up budget is the default"
        )
    if gpu and gpu_bytes is None:
        notes.append("no --gpu-memory given: GPU fit not checked")
    startup = startup_override or startup_seconds(fit if gpu else None)
    if not gpu:
        startup = startup_override or 600
    if gpu and world > gpus_per_node and not startup_override:
        startup += WORKER_SCHEDULING_S
    return Sizing(backend, world, gpus_per_node, launch, list(engines), fit, startup, notes)


# ------------------------------------------------------------------ capacity
@dataclass(frozen=True)
class Capacity:
    """Replicas for a request rate, from one instance's measured throughput."""

    rate_rps: float
    per_instance_rps: float
    replicas: int
    sizing: Sizing

    @property
    def gpus(self) -> int:
        return self.replicas * self.sizing.gpus

    @property
    def pods(self) -> int:
        return self.replicas * self.sizing.pods


def capacity(sizing: Sizing, rate_rps: float, per_instance_rps: float) -> Capacity:
    """``ceil(rate / per-instance throughput)`` instances (at least one)."""
    if per_instance_rps <= 0:
        raise DeployError(
            f"per-instance throughput {per_instance_rps} req/s must be positive",
            "take it from the benchmark's aggregate throughput at the load you plan for",
        )
    replicas = max(1, math.ceil(rate_rps / per_instance_rps - 1e-9))
    return Capacity(rate_rps, per_instance_rps, replicas, sizing)


def instance_rps(summary: dict[str, Any], route: str, level: int, where: str) -> float:
    """Requests/s one instance served on ``route`` at closed-loop ``level`` in a
    benchmark: its aggregate completion tokens/s (``load_throughput``, every arm
    together, lowest temperature) over the median completion length of that
    route and level's cells. The benchmark must have run on the deployment's GPU."""
    rows = [
        r
        for r in summary.get("load_throughput") or []
        if r.get("route") == route and r.get("concurrency") == level and r.get("tokens_per_second")
    ]
    lengths = [
        float(c["completion_tokens_median"])
        for c in summary.get("cells") or []
        if c.get("route") == route
        and c.get("concurrency") == level
        and c.get("completion_tokens_median")
    ]
    if not rows or not lengths:
        levels = sorted(
            {int(r["concurrency"]) for r in summary.get("load_throughput") or []
             if r.get("route") == route and r.get("concurrency") is not None}
        )  # fmt: skip
        raise DeployError(
            f"{where}: no throughput for route {route!r} at concurrency {level}"
            + (f" (measured levels: {', '.join(map(str, levels))})" if levels else ""),
            "pass a route and --level the benchmark measured (spec routes.<name>.concurrency)",
        )
    tps = float(min(rows, key=lambda r: float(r.get("temperature") or 0))["tokens_per_second"])
    return tps / (sum(lengths) / len(lengths))


def gib_text(n: int | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"
