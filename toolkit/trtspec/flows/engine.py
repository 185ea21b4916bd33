"""The engine flow: TensorRT-LLM's ``trtllm-build`` engines behind Triton's
``tensorrtllm`` C++ backend (NGC Triton containers up to 26.07, TensorRT-LLM
up to 1.2.x), with the reference Python engine standing in on CPU. Its stages
live where they always have (``trtspec.plan``, ``trtspec.build``,
``trtspec.repo``, ``trtspec.modes``); this module is only its face at the
seam, so nothing about the engine flow changes behind it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.modes import MODE_MODULES

if TYPE_CHECKING:
    from trtspec.artifacts.routing import RoutingTable
    from trtspec.memory import MemoryPlan
    from trtspec.plan import Plan
    from trtspec.spec import Spec


class EngineFlow:
    name = "engine"
    modes = tuple(MODE_MODULES)
    metrics = (
        "ttft_ms",
        "latency_ms",
        "tpot_ms",
        "tokens_per_second",
        "draft_tokens",
        "accepted_tokens",
        "rounds",
        "prefix_reused_tokens",
    )

    def plan(self, spec: Spec, engines_root: Path, examples_dir: str | None) -> Plan:
        from trtspec.plan import make_plan

        return make_plan(spec, engines_root, examples_dir=examples_dir)

    def memory_plan(self, spec: Spec, plan: Plan, gpu_bytes: int | None) -> MemoryPlan:
        from trtspec.memory import memory_plan

        return memory_plan(spec, plan, gpu_bytes)

    def memory_warnings(self, memory: MemoryPlan) -> list[str]:
        return memory.warnings()

    def files(
        self, spec: Spec, plan: Plan, engines_root: Path, *, memory: MemoryPlan | None = None
    ) -> dict[Path, str]:
        return {}  # the engine folders are the whole product

    def write_files(self, files: dict[Path, str]) -> list[Path]:
        return []

    def assemble(
        self,
        spec: Spec,
        plan: Plan,
        engines_root: Path,
        output: Path,
        *,
        routing: RoutingTable | None,
        memory: MemoryPlan | None,
        golden: dict[str, list[str]] | None = None,
    ) -> Path:
        from trtspec.repo.assemble import assemble

        return assemble(
            spec, plan, engines_root, output, routing=routing, memory=memory, golden=golden
        )


FLOW = EngineFlow()
