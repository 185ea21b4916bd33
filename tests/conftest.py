"""Shared pytest fixtures: tiny real models built once per session; and the
hook that closes each ``Shared`` resource (tests/fixtures/shared.py) right
after the last collected test that uses it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.shared import SHARED
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


_LAST_USERS = pytest.StashKey[dict[str, pytest.Item]]()


def _last_users(session: pytest.Session) -> dict[str, pytest.Item]:
    """Fixture name → the last collected test that uses it (directly or not)."""
    if _LAST_USERS not in session.stash:
        users: dict[str, pytest.Item] = {}
        for item in session.items:
            for name in getattr(item, "fixturenames", ()):
                users[name] = item
        session.stash[_LAST_USERS] = users
    return session.stash[_LAST_USERS]


@pytest.hookimpl(trylast=True)  # after pytest's own teardown: a failing close skips nothing
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    last = _last_users(item.session)
    for name, handle in list(SHARED.items()):
        if last.get(name) is item:
            handle.close()
