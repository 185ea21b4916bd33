"""Shared pytest fixtures: tiny real models built once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.tiny_model import make_tiny_draft, make_tiny_llama


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + trained tokenizer (a real HF folder)."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_draft(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A noisy copy of ``tiny_llama``: agrees with it on some tokens only."""
    return make_tiny_draft(tiny_llama, tmp_path_factory.mktemp("tiny") / "tiny-draft")


@pytest.fixture
def has_tritonserver() -> bool:
    return shutil.which("tritonserver") is not None
