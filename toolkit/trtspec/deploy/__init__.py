"""Deployment beyond one machine: Kubernetes manifests for the engine flow
(``k8s``: Deployment or multi-node LeaderWorkerSet, Service, ServiceMonitor,
HPA; sized by ``sizing`` from the memory plan; inputs read by ``inputs``) and
NVIDIA Dynamo graphs for the LLM-API flow (``dynamo``). trtspec hands the
decided deployment to engines that already run at scale and never schedules
anything itself. No Click here; ``trtspec.cli.deploy`` is the command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.deploy.inputs import served_from
from trtspec.deploy.k8s import K8sOptions, Manifests, build
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
) -> tuple[Manifests, Sizing]:
    """The manifests of ``spec``'s deployment and the sizing behind them; every
    check runs here, so a caller that gets them back can write them."""
    served = served_from(spec, plan, repo=repo, routing_file=routing_file)
    sizing = size_instance(
        spec,
        mp,
        served.engines,
        gpus_per_node=opts.gpus_per_node,
        gpu_bytes=gpu_bytes,
        startup_override=startup_seconds,
    )
    return build(spec, served, sizing, opts), sizing


__all__ = ["DeployError", "K8sOptions", "Manifests", "Sizing", "k8s_manifests"]
