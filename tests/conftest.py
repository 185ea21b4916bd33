"""Shared pytest fixtures: tiny real models built once per session; a pair of
real ``openai_reference`` servers that the external-arm tests share; and the
hook that closes each ``Shared`` resource (tests/fixtures/shared.py) right
after the last collected test that uses it."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.shared import SHARED, Shared, shared, work_unit
from tests.fixtures.tiny_model import make_tiny_draft, make_tiny_llama

pytest_plugins = ["tests.fixtures.ci_skips"]  # under CI=1 an unexpected skip fails


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama + trained tokenizer (a real HF folder)."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_draft(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A noisy copy of ``tiny_llama``: agrees with it on some tokens only."""
    return make_tiny_draft(tiny_llama, tmp_path_factory.mktemp("tiny") / "tiny-draft")


@pytest.fixture(scope="session")
def every_mode_engines(
    tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """One reference engine per engine mode of ``tiny_llama``, built once for
    every module that only loads them (spec_checkpoints.build_every_mode)."""
    from tests.fixtures.spec_checkpoints import build_every_mode

    return build_every_mode(tiny_llama, tmp_path_factory.mktemp("every-mode-engines"))


@pytest.fixture(scope="session")
def hf_tiny_llama(tiny_llama: Path):
    """``tiny_llama`` as plain Hugging Face loads it (float32, eval): the
    reference engine's independent reference, loaded once per session."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_tiny_llama) -> Callable[[Sequence[int], int], list[int]]:
    """``hf_greedy(prompt_ids, n)`` → the first ``n`` tokens Hugging Face
    ``generate()`` picks greedily after ``prompt_ids`` on ``tiny_llama``: the
    truth every lossless test compares with, independent of the reference
    engine. Each prompt is generated once per session, at the longest length
    asked so far (a greedy continuation of n tokens is the prefix of a longer
    one)."""
    import torch

    model = hf_tiny_llama
    done: dict[tuple[int, ...], list[int]] = {}

    def greedy(prompt: Sequence[int], n: int) -> list[int]:
        key = tuple(prompt)
        if len(done.get(key, ())) < n:
            with torch.inference_mode():
                out = model.generate(
                    torch.tensor([list(prompt)]),
                    attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                    max_new_tokens=max(n, 40),
                    do_sample=False,
                    eos_token_id=None,
                    pad_token_id=0,
                )
            done[key] = out[0, len(prompt) :].tolist()
            assert len(done[key]) >= n, f"HF generate stopped early: {done[key]}"
        return done[key][:n]

    return greedy


@contextlib.contextmanager
def _openai_pair(tiny_llama: Path, root: Path) -> Iterator[dict[str, str]]:
    from tests.fixtures.openai_servers import openai_reference
    from tests.fixtures.spec_checkpoints import build_engine

    dte = build_engine(
        tiny_llama,
        root / "target_dte",
        "draft_tokens_external",
        max_draft_len=4,
        max_batch_size=2,
        max_input_len=256,
        max_seq_len=512,
    )
    with (
        openai_reference(dte, mode="none") as base,
        openai_reference(dte, mode="ngram", num_draft_tokens=4) as ngram,
    ):
        yield {"base": base, "ngram": ngram}


@pytest.fixture(scope="session")
def openai_pair(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    """``.get()`` → ``{"base": url, "ngram": url}``: two real ``openai_reference``
    servers on the tiny model's draft_tokens_external engine, a target-only
    one and a prompt-lookup (ngram, k=4) one, standing in for a vLLM pair.
    Shared by tests/e2e/test_external_arms.py and
    tests/integration/test_bench_external.py: both only send requests (and
    read counter deltas, never totals); stopped after the last of them."""
    with shared(
        "openai_pair", lambda: _openai_pair(tiny_llama, tmp_path_factory.mktemp("openai"))
    ) as handle:
        yield handle


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


@pytest.fixture
def last_user_of(request: pytest.FixtureRequest) -> Callable[[str], bool]:
    """``last_user_of(name)``: whether the running test is the last one that
    uses the shared fixture ``name`` (a test that breaks the shared resource
    need not put it back when nobody reads it after it)."""
    return lambda name: _last_users(request.session).get(name) is request.node


@pytest.hookimpl(trylast=True)  # after pytest's own teardown: a failing close skips nothing
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    last = _last_users(item.session)
    for name, handle in list(SHARED.items()):
        if last.get(name) is item:
            handle.close()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; unused without it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile``, with the files of one ``Shared`` resource given
    to one process together (tests/fixtures/shared.GROUPS)."""
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own for any other --dist
    from xdist.scheduler import LoadFileScheduling

    class SharedFirstScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return SharedFirstScheduling(config, log)
