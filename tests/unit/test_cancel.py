"""trtspec.cancel: one request's cancellation seen by every model of a chain."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec import cancel
from trtspec.cancel import PARAMETER, Cancellation, cancel_stream


class Sender:
    """What Triton hands a decoupled model: ``is_cancelled()`` (a stand-in;
    the served tests use the real one)."""

    def __init__(self) -> None:
        self.cancelled = False

    def is_cancelled(self) -> bool:
        return self.cancelled


class Request:
    def __init__(self, parameters: object) -> None:
        self._parameters = parameters

    def parameters(self) -> str:
        return json.dumps(self._parameters)


@pytest.fixture(autouse=True)
def flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cancel.tempfile, "gettempdir", lambda: str(tmp_path))
    return cancel.flag_dir()


def test_a_cancel_seen_at_the_head_reaches_every_model_below(flags: Path) -> None:
    client = Sender()
    router = Cancellation(client)
    orchestrator = Cancellation.of(Request(router.parameters()), Sender())
    engine = Cancellation.of(Request(orchestrator.parameters()), None)
    assert router.token == orchestrator.token == engine.token
    assert not (router.is_cancelled() or orchestrator.is_cancelled() or engine.is_cancelled())
    client.cancelled = True
    assert router.is_cancelled()  # raises the flag
    assert orchestrator.is_cancelled() and engine.is_cancelled()
    assert (flags / router.token).exists()
    assert flags.stat().st_mode & 0o777 == 0o700
    orchestrator.close()  # not the raiser: leaves the flag
    assert (flags / router.token).exists()
    router.close()
    assert list(flags.iterdir()) == []


def test_heads_mint_distinct_tokens_and_odd_parameters_are_ignored() -> None:
    assert Cancellation(None).token != Cancellation(None).token
    for params in ({}, {PARAMETER: "../../etc/passwd"}, {PARAMETER: 7}, [1, 2], "x" * 3):
        assert Cancellation.of(Request(params), None).token.isalnum()
        assert Cancellation.of(Request(params), None).token != params


def test_cancel_stream_calls_cancel_only_where_it_exists() -> None:
    class Iterator:
        cancelled = False

        def cancel(self) -> None:
            self.cancelled = True

    it = Iterator()
    cancel_stream(it)
    assert it.cancelled
    cancel_stream(iter([]))  # python_backend 2.51's iterator: nothing to call


def test_an_unwritable_flag_folder_never_fails_the_model(flags: Path) -> None:
    flags.write_text("not a folder")  # e.g. squatted by someone else
    client = Sender()
    head = Cancellation(client)
    client.cancelled = True
    assert head.is_cancelled()  # this model still stops
    head.close()
    assert flags.read_text() == "not a folder"
