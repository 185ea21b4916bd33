"""One module per speculative mode, and the registry the stages dispatch through.

Each ``trtspec/modes/<mode>.py`` owns what is particular to its mode:
``SPEC_CLASS`` (the variant's pydantic class, its derived values computed by
validators), ``check(spec, variant, path, tools)`` (cross-field rules),
``gpu_steps`` / ``reference_steps`` (the build recipe per backend, given the
planner's builder), ``engine_parameters(variant)`` and
``orchestrator_parameters(variant)`` (Triton parameters). What several stages
need about a mode (engine mode, TRT-LLM integer, who drafts, engine names) is
a row of ``trtspec.catalogue``; the reference engine's proposer is
``trtspec.runtime.engine.proposers.PROPOSERS[<engine mode>]``.
``tests/unit/test_modes.py`` holds every catalogue row to all of these.

The modules import nothing from the stages (``base`` holds the shared types
and the interfaces a stage hands in), so the spec, the planner and the
repository builder can all import this registry.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from trtspec.modes import draft_model, eagle, lookahead, medusa, ngram

#: Spec mode name -> its module, in the catalogue's order.
MODE_MODULES: dict[str, ModuleType] = {
    m.MODE: m for m in (draft_model, ngram, medusa, eagle, lookahead)
}

#: What a complete mode module defines.
REQUIRED = (
    "MODE",
    "SPEC_CLASS",
    "check",
    "gpu_steps",
    "reference_steps",
    "engine_parameters",
    "orchestrator_parameters",
)


def module_for(variant: Any) -> ModuleType:
    """The mode module of a spec variant (or of a mode name)."""
    return MODE_MODULES[variant if isinstance(variant, str) else variant.mode]
