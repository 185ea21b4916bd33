"""The mode catalogue: every fact about a speculative mode that more than one
stage needs, written once.

Two tables. ``ENGINE_MODES`` is TensorRT-LLM's ``SpeculativeDecodingMode`` as
an engine carries it (the integer in ``build_config.speculative_decoding_mode``,
the ``trtllm-build --speculative_decoding_mode`` choice, the tensorrtllm
backend's ``decoding_mode`` parameter, whether the reference backend runs it).
``MODES`` is the spec's modes (the ``mode:`` of a variant): which engine mode
serves it, whether the orchestrator or the engine drafts, whether TRT-LLM
decodes it greedily only, whether its draft length ``k`` is swept at bench
time, and the name prefix of its engine. Plus the lookahead (W, N, G) rules
and the baseline's name.

Sources (TensorRT-LLM source): ``tensorrt_llm/models/modeling_utils.py``
``SpeculativeDecodingMode`` (an ``IntFlag`` of ``auto()`` members: NONE=1,
DRAFT_TOKENS_EXTERNAL=2, MEDUSA=4, LOOKAHEAD_DECODING=8,
EXPLICIT_DRAFT_TOKENS=16, EAGLE=32); ``cpp/include/tensorrt_llm/executor/
executor.h`` and ``cpp/tensorrt_llm/executor/decodingConfig.cpp``
(``LookaheadDecodingConfig::calculateSpeculativeResourceTuple``: the
engine's ``max_draft_len`` for (W, N, G); ``isLegal``). The ``decoding_mode``
strings are the values trtspec's repository builder has always written for
the tensorrtllm backend's ``decoding_mode`` parameter.

Ground level: imports only the standard library, because the reference
engine and the orchestrator import it inside tritonserver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

#: The target-only variant every spec has; also its Triton orchestrator name.
BASELINE = "baseline"
#: A promoted route starts on its variant with this share of its traffic (the
#: canary) and ramps through these steps (spec ``rollout``; trtspec.rollout).
DEFAULT_CANARY_PERCENT = 5
DEFAULT_STEPS = (5, 25, 50, 100)


@dataclass(frozen=True)
class EngineMode:
    """One value of TRT-LLM's ``SpeculativeDecodingMode`` as an engine carries it."""

    name: str  # trtspec's name (engine config, reference backend, repository)
    trtllm_int: int  # build_config.speculative_decoding_mode
    trtllm_flag: str  # trtllm-build --speculative_decoding_mode choice
    decoding_mode: str | None  # tensorrtllm backend parameter; None = auto-detected
    reference: bool  # the CPU reference backend can run it


ENGINE_MODES: dict[str, EngineMode] = {
    m.name: m
    for m in (
        EngineMode("none", 1, "none", "top_k_top_p", reference=True),
        EngineMode("draft_tokens_external", 2, "draft_tokens_external", None, reference=True),
        EngineMode("medusa", 4, "medusa", "medusa", reference=True),
        EngineMode("eagle", 32, "eagle", "eagle", reference=True),
        EngineMode("lookahead", 8, "lookahead_decoding", "lookahead", reference=True),
        EngineMode("explicit_draft_tokens", 16, "explicit_draft_tokens", None, reference=False),
    )
}


@dataclass(frozen=True)
class Mode:
    """One spec mode (a variant's ``mode:``)."""

    name: str  # the spec's mode name
    engine_mode: str  # key of ENGINE_MODES
    drafted_in: Literal["orchestrator", "engine"]
    greedy_only: bool  # TRT-LLM decodes it greedily only (temperature 0)
    k_sweepable: bool  # num_draft_tokens swept at bench time
    engine_prefix: str  # target engine name (orchestrator) or its prefix + variant name

    @property
    def draft_loop(self) -> bool:
        """The orchestrator drafts and the target verifies (a BLS draft loop)."""
        return self.drafted_in == "orchestrator"

    def engine_name(self, variant: str) -> str:
        """The plan's name of the target engine that serves ``variant``."""
        return self.engine_prefix if self.draft_loop else f"{self.engine_prefix}_{variant}"


MODES: dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("draft_model", "draft_tokens_external", "orchestrator", False, True, "target_dte"),
        Mode("ngram", "draft_tokens_external", "orchestrator", False, True, "target_dte"),
        Mode("medusa", "medusa", "engine", True, False, "target_medusa"),
        Mode("eagle", "eagle", "engine", True, False, "target_eagle"),
        Mode("lookahead", "lookahead", "engine", False, False, "target_lookahead"),
    )
}

#: Spec modes drafted by the orchestrator (a draft loop against ``target_dte``).
DRAFT_LOOP_MODES: tuple[str, ...] = tuple(m.name for m in MODES.values() if m.draft_loop)

#: The one target engine every draft-loop variant shares.
DRAFT_LOOP_ENGINE = MODES[DRAFT_LOOP_MODES[0]].engine_prefix

#: Engine modes by their TRT-LLM integer, and by their trtllm-build flag.
ENGINE_MODE_BY_INT: dict[int, EngineMode] = {m.trtllm_int: m for m in ENGINE_MODES.values()}
ENGINE_MODE_BY_FLAG: dict[str, EngineMode] = {m.trtllm_flag: m for m in ENGINE_MODES.values()}


def engine_mode(name: str) -> EngineMode:
    """An engine mode by trtspec name or trtllm-build flag; ``KeyError`` if neither."""
    found = ENGINE_MODES.get(name) or ENGINE_MODE_BY_FLAG.get(name)
    if found is None:
        raise KeyError(name)
    return found


#: Lookahead's (W, N, G) by name: the tensorrtllm backend's engine-model
#: parameters and its per-request input tensors (read from TRT-LLM 0.19 on).
LOOKAHEAD_INPUTS = (
    "lookahead_window_size",
    "lookahead_ngram_size",
    "lookahead_verification_set_size",
)


def lookahead_max_draft_len(window: int, ngram: int, verification: int) -> int:
    """TRT-LLM's engine ``max_draft_len`` for lookahead (W, N, G)."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification) * (ngram - 1)


def lookahead_problem(window: int, ngram: int, verification: int) -> str | None:
    """Why (W, N, G) is illegal under TRT-LLM's rules, or ``None`` when legal."""
    if window < 1 or ngram < 1 or verification < 0:
        return "need W >= 1, N >= 1, G >= 0"
    if ngram == 1 and (window != 1 or verification != 0):
        return "N == 1 requires W == 1 and G == 0"
    return None
