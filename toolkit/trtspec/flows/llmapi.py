"""The LLM-API flow at the seam: TensorRT-LLM's PyTorch flow, one
LLM-argument YAML per variant served by Triton's ``llmapi`` Python model or
``trtllm-serve``. What each variant's file holds is in ``llmapi_config``;
the Triton repository in ``llmapi_repo``; the field tables in
``trtspec.runtime.llm_args``; the spec's rules in ``trtspec.spec.flows``. This
module is the flow object the stages call."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from trtspec.catalogue import BASELINE
from trtspec.flows import llmapi_config as config
from trtspec.flows import llmapi_repo

if TYPE_CHECKING:
    from trtspec.artifacts.routing import RoutingTable
    from trtspec.memory import MemoryPlan
    from trtspec.plan import Plan
    from trtspec.spec import Spec


# -------------------------------------------------------------------- flow
class LlmApiFlow:
    name = "llmapi"
    modes = ("draft_model", "ngram", "eagle", "mtp")
    metrics = ("ttft_ms", "latency_ms", "tpot_ms", "tokens_per_second")

    def plan(self, spec: Spec, engines_root: Path, examples_dir: str | None) -> Plan:
        from trtspec.plan import Plan, VariantEngines, make_plan

        if spec.flow.builds_engines(spec.backend):
            # the reference engines the CPU stand-in serves (target, target_dte, drafts)
            return make_plan(spec, engines_root, examples_dir=examples_dir)
        # On a GPU the LLM API loads the checkpoints itself: nothing to build.
        return Plan(
            spec_name=spec.name,
            spec_hash=spec.spec_hash,
            backend=spec.backend.value,
            root=Path(engines_root) / spec.name,
            engines=[],
            steps=[],
            variants={
                BASELINE: VariantEngines(config.llm_model_name(BASELINE), None, "none"),
                **{
                    v.name: VariantEngines(config.llm_model_name(v.name), None, v.mode)
                    for v in spec.variants
                },
            },
        )

    def memory_plan(self, spec: Spec, plan: Plan, gpu_bytes: int | None) -> MemoryPlan:
        from trtspec.flows.llmapi_memory import llmapi_memory_plan

        return llmapi_memory_plan(spec, plan.root, gpu_bytes)

    def memory_warnings(self, memory: MemoryPlan) -> list[str]:
        from trtspec.flows.llmapi_memory import UNEVEN_SPLIT

        # without a GPU size each variant's KV share depends on the load order
        uneven = memory.gpu is None and len(memory.engines) > 1
        return memory.warnings() + ([UNEVEN_SPLIT] if uneven else [])

    def files(
        self, spec: Spec, plan: Plan, engines_root: Path, *, memory: MemoryPlan | None = None
    ) -> dict[Path, str]:
        return config.config_files(spec, plan, engines_root, memory=memory)

    def write_files(self, files: dict[Path, str]) -> list[Path]:
        return config.write_files(files)

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
        return llmapi_repo.assemble(
            spec, plan, engines_root, output, routing=routing, golden=golden, memory=memory
        )


FLOW = LlmApiFlow()
