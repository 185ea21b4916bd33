"""Deployment beyond one machine: Kubernetes manifests for the engine flow
(``k8s``: Deployment or multi-node LeaderWorkerSet (``k8s_multinode``),
Service, ServiceMonitor, PodDisruptionBudget, volume claim, HPA; the pod in
``k8s_pod``; sized by ``sizing`` from the memory plan; inputs read by
``inputs``; the repository's paths moved in the pod by ``relocate``) and
NVIDIA Dynamo graphs for the LLM-API flow (``dynamo``). trtspec hands the
decided deployment to engines that already run at scale and never schedules
anything itself. No Click here; ``trtspec.cli.deploy`` is the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.deploy.inputs import served_from
from trtspec.deploy.k8s import build, check_options
from trtspec.deploy.options import K8sOptions, Manifests
from trtspec.deploy.sizing import DeployError, Sizing, size_instance
from trtspec.memory import MemoryPlan


def k8s_manifests(
    spec: Any,
    plan: Any,
    mp: MemoryPlan | None,
    opts: K8sOptions,
    *,
    repo: Path | None = None,
    routing_file: Path | None = None,
    gpu_bytes: int | None = None,
    startup_seconds: int | None = None,
    baseline_only: bool = False,
) -> tuple[Manifests, Sizing]:
    """The manifests of ``spec``'s deployment and the sizing behind them; every
    check runs here, so a caller that gets them back can write them."""
    check_options(spec, opts)
    if opts.gateway:
        from trtspec.deploy import gateway

        if baseline_only:
            raise DeployError(
                "--gateway with --baseline-only: there is no canary to split",
                "leave out one of them",
            )
        return gateway.manifests(
            spec, plan, mp, opts, repo=repo, routing_file=routing_file, gpu_bytes=gpu_bytes,
            startup_seconds=startup_seconds,
        )  # fmt: skip
    served = served_from(
        spec, plan, repo=repo, routing_file=routing_file, baseline_only=baseline_only
    )
    sizing = size_instance(
        spec,
        mp,
        served.engines,
        gpus_per_node=opts.gpus_per_node,
        gpu_bytes=gpu_bytes,
        startup_override=startup_seconds,
        engine_gpus_per_node=served.engine_gpus_per_node,
    )
    return build(spec, served, sizing, opts), sizing


__all__ = ["DeployError", "K8sOptions", "Manifests", "Sizing", "k8s_manifests"]
