"""Serving flows behind one seam: which one a spec uses is decided here, once,
and handed on as an object that knows its own behaviour.

A flow answers for every stage: which variant modes it serves
(``modes``) and which per-request metrics it reports (``metrics``), what is
prepared per variant (``plan``: the build steps; ``files``: files
written next to the engines, such as LLM-argument YAMLs), its GPU memory plan
(``memory_plan``, made once per command and handed to ``files`` and
``assemble``; ``memory_warnings``), the Triton models it contributes
(``assemble``). Stages never compare flow or backend names: they ask this
object, the spec's flow (``spec.flow.llm_api``, ``builds_engines``) or the
backend (``spec.backend.gpu``); ``tests/unit/test_backend_seam.py`` holds them
to it.

- ``engine`` (``trtspec.flows.engine``): TensorRT-LLM's engine flow, today's
  behaviour, unchanged: ``trtllm-build`` engines served by Triton's
  ``tensorrtllm`` backend; the reference backend stands in on CPU.
- ``llmapi`` (``trtspec.flows.llmapi``): TensorRT-LLM's PyTorch flow: one
  LLM-argument YAML per variant, served by Triton's ``llmapi`` Python model
  (``model.yaml``) or ``trtllm-serve --config``; the reference backend serves
  the same contract on CPU.

The spec face of each flow (its ``flow:`` section, the variant rules under
it, whether a request may set its own draft length) is its class in
``trtspec.spec.flows``, so the spec never imports the stages. The registry
maps the spec's ``flow.kind`` to the module holding its stage object; modules
load on first use. A third flow is one module here, one line in
``FLOW_MODULES`` and one class in ``trtspec.spec.flows``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trtspec.artifacts.routing import RoutingTable
    from trtspec.memory import MemoryPlan
    from trtspec.plan import Plan
    from trtspec.spec import Spec

#: flow kind (the spec's ``flow.kind``) -> the module whose ``FLOW`` serves it.
FLOW_MODULES: dict[str, str] = {
    "engine": "trtspec.flows.engine",
    "llmapi": "trtspec.flows.llmapi",
}


class Flow(Protocol):
    """What every stage asks of a serving flow."""

    name: str
    #: spec variant modes this flow serves (others are refused at spec load)
    modes: tuple[str, ...]
    #: per-request measures its served variants report (bench column names)
    metrics: tuple[str, ...]

    def plan(self, spec: Spec, engines_root: Path, examples_dir: str | None) -> Plan: ...

    def memory_plan(self, spec: Spec, plan: Plan, gpu_bytes: int | None) -> MemoryPlan:
        """The GPU memory plan of a GPU spec against ``gpu_bytes`` per GPU
        (``--gpu-memory``; None: no size given)."""
        ...

    def memory_warnings(self, memory: MemoryPlan) -> list[str]:
        """What the user must act on in ``memory`` (empty when it fits)."""
        ...

    def files(
        self, spec: Spec, plan: Plan, engines_root: Path, *, memory: MemoryPlan | None = None
    ) -> dict[Path, str]:
        """Files written beside the engines (path -> text), generated and
        checked before any build step runs; ``memory`` (``memory_plan``,
        None for the reference backend) sizes what depends on the GPU."""
        ...

    def write_files(self, files: dict[Path, str]) -> list[Path]: ...

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
        """The Triton repository ``output/<spec>/``; ``memory`` is the plan
        the caller made once (``memory_plan``; None for the reference backend)."""
        ...


def flow_named(kind: str) -> Flow:
    flow: Flow = importlib.import_module(FLOW_MODULES[kind]).FLOW
    return flow


def flow_for(spec: Spec) -> Flow:
    """The flow object of a spec (``spec.flow.kind``)."""
    return flow_named(spec.flow.kind)


def make_plan(
    spec: Spec, engines_root: Path = Path("engines"), *, examples_dir: str | None = None
) -> Plan:
    """The build plan of a spec under its flow (``trtspec.plan.make_plan`` for
    the engine flow)."""
    return flow_for(spec).plan(spec, Path(engines_root), examples_dir)


def stage_plan(
    spec: Spec,
    engines_root: Path = Path("engines"),
    *,
    examples_dir: str | None = None,
    spec_path: str | Path | None = None,
) -> Plan:
    """For a stage that may run before any build (``trtspec doctor``,
    ``trtspec deploy``, a benchmark): the plan ``trtspec build`` wrote
    (``trtspec.artifacts.plan``; one written for other build inputs is
    refused), else the plan made now, as a dry run makes it."""
    from trtspec.artifacts.plan import plan_path

    if plan_path(spec.name, engines_root).is_file():
        return load_plan(spec, engines_root, spec_path=spec_path)
    return make_plan(spec, engines_root, examples_dir=examples_dir)


def load_plan(
    spec: Spec, engines_root: Path = Path("engines"), *, spec_path: str | Path | None = None
) -> Plan:
    """The plan ``trtspec build`` wrote for ``spec`` (``engines/<spec>/plan.json``);
    a missing, old or stale one is refused, naming the fix."""
    from trtspec.artifacts.plan import plan_path, read_plan
    from trtspec.errors import ArtifactError
    from trtspec.plan import plan_from_dict

    data = read_plan(spec, engines_root, spec_path=spec_path)
    try:
        return plan_from_dict(data, spec.spec_hash)
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(
            f"{plan_path(spec.name, engines_root)}: plan: malformed ({exc!r})",
            f"run `trtspec build {spec_path or spec.name}` again",
        ) from None
