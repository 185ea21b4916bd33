"""``router/rollout.json`` (``RolloutConfig``) from a spec, written by
``trtspec repo``: the spec's ``rollout`` block (ramp, window, golden rate,
log), the bench's decision thresholds, what each variant is (the request
log's ``speculative``, ``draft_model`` and ``num_speculative_tokens``) and
the golden set ``trtspec.rollout.golden`` rendered (passed in: rendering
chat prompts needs the tokenizer and the benchmark's prompt loader).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.artifacts.rollout_state import THRESHOLD_KEYS, RolloutConfig
from trtspec.catalogue import DRAFT_LOOP_MODES

if TYPE_CHECKING:
    from trtspec.spec.schema import Spec


def variant_facts(spec: Spec, variants: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """variant name -> {speculative, draft_model, num_speculative_tokens};
    ``variants`` are the repository's ``VariantModel``s."""
    out: dict[str, dict[str, Any]] = {}
    for name, model in variants.items():
        speculative = model.mode != "none"
        draft_model = None
        if speculative and model.spec is not None and getattr(model.spec, "draft", None):
            draft_model = spec.model_location(model.spec.draft.model).ref
        k: int | None = None
        if model.mode in DRAFT_LOOP_MODES:
            k = int(model.num_draft_tokens)
        elif speculative:
            k = int(model.max_draft_len) or None
        out[name] = {
            "speculative": speculative,
            "draft_model": draft_model,
            "num_speculative_tokens": k,
        }
    return out


def rollout_config(
    spec: Spec, variants: dict[str, Any], golden: dict[str, list[str]] | None = None
) -> RolloutConfig:
    r = spec.rollout
    decision = spec.bench.decision.model_dump()
    return RolloutConfig(
        model=str(spec.target.model),
        steps=tuple(int(s) for s in r.steps),
        window_requests=r.window_requests,
        min_requests=r.min_requests,
        golden_every=r.golden_every,
        golden_max_tokens=r.golden_max_tokens,
        auto_rollback=r.auto_rollback,
        thresholds={k: float(decision[k]) for k in THRESHOLD_KEYS},
        log=r.log.model_dump(),
        variants=variant_facts(spec, variants),
        golden=dict(golden or {}),
    )
