"""Completeness of the speculative modes: every row of the mode catalogue
(``trtspec.catalogue``) has a mode module (``trtspec.modes``) with a spec
class, checks, a build recipe per backend and Triton parameters, is part of
the spec's variant union, and (engine-drafted modes) has a reference-engine
proposer; every reference-runnable engine mode has a proposer too. A
half-added mode fails here, in ``make test``, not at serve time."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

import pytest

from trtspec import catalogue
from trtspec.modes import MODE_MODULES, REQUIRED
from trtspec.runtime.engine import proposers
from trtspec.spec import schema

#: A recipe's and a checker's parameters, as the stages call them.
SIGNATURES = {
    "check": ["spec", "v", "base", "tools"],
    "gpu_steps": ["b", "spec", "v", "target_src"],
    "reference_steps": ["b", "spec", "v", "target_src"],
    "engine_parameters": ["v"],
    "orchestrator_parameters": ["v"],
}


def _union_members() -> set[type]:
    variant = typing.get_args(schema.Variant)[0]  # Annotated[Union[...], Field(...)]
    return set(typing.get_args(variant))


def missing_parts() -> list[str]:
    """Everything a catalogue row lacks, one line per gap (empty: complete)."""
    gaps: list[str] = []
    for name, row in catalogue.MODES.items():
        if row.engine_mode not in catalogue.ENGINE_MODES:
            gaps.append(f"{name}: engine mode {row.engine_mode!r} is not in ENGINE_MODES")
        module = MODE_MODULES.get(name)
        if module is None:
            gaps.append(f"{name}: no module in trtspec.modes.MODE_MODULES")
            continue
        gaps += [f"{name}: module lacks {attr}" for attr in REQUIRED if not hasattr(module, attr)]
        for attr, params in SIGNATURES.items():
            fn = getattr(module, attr, None)
            if fn is not None and list(inspect.signature(fn).parameters) != params:
                gaps.append(f"{name}: {attr} must take ({', '.join(params)})")
        cls = getattr(module, "SPEC_CLASS", None)
        if cls is not None:
            if cls.model_fields["mode"].default != name:
                gaps.append(f"{name}: SPEC_CLASS.mode defaults to something else")
            if cls not in _union_members():
                gaps.append(f"{name}: SPEC_CLASS is not in trtspec.spec.schema.Variant")
            if schema.MODES.get(name) is not cls:
                gaps.append(f"{name}: trtspec.spec.MODES does not map to SPEC_CLASS")
        engine_mode = row.engine_mode
        proposer = proposers.PROPOSERS.get(engine_mode)
        if proposer is None:
            gaps.append(f"{name}: no reference-engine proposer for engine mode {engine_mode!r}")
        elif not row.draft_loop and proposer is proposers.Proposer:
            gaps.append(f"{name}: drafted in the engine, but its proposer drafts nothing")
    for engine_mode, em in catalogue.ENGINE_MODES.items():
        if em.reference and engine_mode not in proposers.PROPOSERS:
            gaps.append(f"engine mode {engine_mode}: reference-runnable but has no proposer")
    extra = set(MODE_MODULES) - set(catalogue.MODES)
    gaps += [f"{name}: a mode module without a catalogue row" for name in sorted(extra)]
    return gaps


def test_every_catalogue_mode_is_complete() -> None:
    assert missing_parts() == []


def test_the_registries_list_the_catalogue_modes_in_its_order() -> None:
    assert list(MODE_MODULES) == list(catalogue.MODES) == list(schema.MODES)
    assert catalogue.DRAFT_LOOP_MODES == ("draft_model", "ngram")


def _half_added(monkeypatch: pytest.MonkeyPatch, **parts: Any) -> None:
    """A mode ``fake`` with a catalogue row, a new engine mode, and ``parts`` of a module."""
    monkeypatch.setitem(
        catalogue.ENGINE_MODES,
        "fake_engine",
        catalogue.EngineMode("fake_engine", 64, "fake", "fake", True),
    )
    monkeypatch.setitem(
        catalogue.MODES,
        "fake",
        catalogue.Mode("fake", "fake_engine", "engine", False, False, "target_fake"),
    )
    module = types.ModuleType("trtspec.modes.fake")
    for attr, value in parts.items():
        setattr(module, attr, value)
    monkeypatch.setitem(MODE_MODULES, "fake", module)


def test_a_mode_without_a_proposer_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # Everything but the engine's proposer: a complete module, borrowed from medusa.
    medusa = MODE_MODULES["medusa"]
    _half_added(monkeypatch, **{attr: getattr(medusa, attr) for attr in REQUIRED})
    gaps = missing_parts()
    assert "fake: no reference-engine proposer for engine mode 'fake_engine'" in gaps
    assert "engine mode fake_engine: reference-runnable but has no proposer" in gaps
    # (and medusa's class is not fake's: its mode is not "fake")
    assert "fake: SPEC_CLASS.mode defaults to something else" in gaps


def test_a_mode_with_only_a_catalogue_row_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        catalogue.MODES,
        "fake",
        catalogue.Mode("fake", "medusa", "engine", True, False, "target_fake"),
    )
    assert missing_parts() == ["fake: no module in trtspec.modes.MODE_MODULES"]


def test_a_module_missing_its_recipe_and_parameters_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    medusa = MODE_MODULES["medusa"]
    keep = ("MODE", "SPEC_CLASS", "check")
    _half_added(monkeypatch, **{attr: getattr(medusa, attr) for attr in keep})
    monkeypatch.setitem(proposers.PROPOSERS, "fake_engine", proposers.MedusaProposer)
    gaps = missing_parts()
    for attr in ("gpu_steps", "reference_steps", "engine_parameters", "orchestrator_parameters"):
        assert f"fake: module lacks {attr}" in gaps
    assert "fake: SPEC_CLASS is not in trtspec.spec.schema.Variant" not in gaps  # medusa's is


def test_a_recipe_with_the_wrong_signature_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    ngram = MODE_MODULES["ngram"]
    monkeypatch.setattr(ngram, "gpu_steps", lambda b, spec, v: None)
    assert missing_parts() == ["ngram: gpu_steps must take (b, spec, v, target_src)"]


def test_an_engine_mode_drafting_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(proposers.PROPOSERS, "eagle", proposers.Proposer)
    assert missing_parts() == ["eagle: drafted in the engine, but its proposer drafts nothing"]
