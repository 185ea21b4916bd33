"""trtspec.runtime.cancel: one request's cancellation seen by every model of a chain."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trtspec.runtime import cancel
from trtspec.runtime.cancel import PARAMETER, Cancellation, cancel_stream


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


def test_a_model_below_the_head_reads_the_flag_and_never_asks_its_sender() -> None:
    """Its sender's ``is_cancelled()`` is a round trip to the server that
    says nothing the flag does not (a BLS callee hears of a cancel only
    through the flag on 2.51; callers raise it before cancelling a stream)."""
    asked: list[str] = []

    class Counting(Sender):
        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

        def is_cancelled(self) -> bool:
            asked.append(self.name)
            return self.cancelled

    client = Counting("router")
    router = Cancellation(client)
    engine = Cancellation.of(Request(router.parameters()), Counting("engine"))
    assert not router.is_cancelled() and not engine.is_cancelled()
    assert asked == ["router"]
    client.cancelled = True
    assert router.is_cancelled() and engine.is_cancelled()  # the flag
    assert asked == ["router", "router"]
    router.close()


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


def _chain() -> tuple[Sender, Cancellation, Cancellation]:
    client = Sender()
    head = Cancellation(client)
    below = Cancellation.of(Request(head.parameters()), None)
    return client, head, below


@pytest.mark.parametrize("squat", ["file", "symlink", "open_mode", "other_user"])
def test_a_squatted_flag_folder_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, squat: str
) -> None:
    """Another local user who makes $TMPDIR/trtspec-cancel-<uid> first (to
    read or silence our flags) is passed over: the chain uses the next name,
    a folder this user owns with mode 0700, and cancellation still works."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(cancel.tempfile, "gettempdir", lambda: str(tmp))
    base = tmp / f"trtspec-cancel-{os.getuid()}"
    if squat == "file":
        base.write_text("not a folder")
    elif squat == "symlink":
        (tmp_path / "theirs").mkdir()
        base.symlink_to(tmp_path / "theirs")
    elif squat == "open_mode":
        base.mkdir()
        base.chmod(0o777)
    else:
        if os.getuid() != 0:
            pytest.skip("making a folder owned by another user needs root")
        base.mkdir(mode=0o700)
        os.chown(base, 65534, 65534)  # nobody
    client, head, below = _chain()
    folder = cancel.flag_dir()
    assert folder == tmp / f"trtspec-cancel-{os.getuid()}-1"
    st = folder.lstat()
    assert st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    client.cancelled = True
    assert head.is_cancelled() and below.is_cancelled()
    assert (folder / head.token).exists()
    assert not any(p.name == head.token for p in tmp_path.rglob("*") if folder not in p.parents)
    head.close()
    assert not (folder / head.token).exists()


def test_the_servers_own_folder_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = tmp_path / "server-cancel"
    own.mkdir(mode=0o700)
    monkeypatch.setenv(cancel.DIR_ENV, str(own))
    client, head, below = _chain()
    assert cancel.flag_dir() == own
    client.cancelled = True
    assert head.is_cancelled() and below.is_cancelled()
    assert (own / head.token).exists()


def test_an_unwritable_flag_folder_never_fails_the_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(cancel.tempfile, "gettempdir", lambda: str(tmp))
    base = tmp / f"trtspec-cancel-{os.getuid()}"
    for n in range(cancel._TRIES):  # every name squatted
        (tmp / f"{base.name}-{n}" if n else base).write_text("not a folder")
    client = Sender()
    head = Cancellation(client)
    client.cancelled = True
    assert head.is_cancelled()  # this model still stops
    head.close()
    assert base.read_text() == "not a folder"


def test_a_polling_model_asks_at_most_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``poll_s`` (what the served models pass: ``cancel.POLL_S``) the
    sender's round trip and the flag's ``stat`` happen at most once per
    interval, the first time one interval after the request began (so no
    round trip delays its first token); a cancel is seen at the first ask
    after it."""
    clock = [100.0]
    monkeypatch.setattr(cancel.time, "monotonic", lambda: clock[0])
    asked = []

    class Counting(Sender):
        def is_cancelled(self) -> bool:
            asked.append(clock[0])
            return self.cancelled

    client = Counting()
    head = Cancellation(client, poll_s=cancel.POLL_S)
    assert not any(head.is_cancelled() for _ in range(50))
    assert asked == []  # the first interval: no round trip
    clock[0] += cancel.POLL_S
    assert not any(head.is_cancelled() for _ in range(50))
    first = 100.0 + cancel.POLL_S
    assert asked == [first]  # 50 steps within one interval: one round trip
    client.cancelled = True
    assert not head.is_cancelled()  # not asked again yet
    clock[0] += cancel.POLL_S
    assert head.is_cancelled() and head.is_cancelled()
    assert asked == [first, first + cancel.POLL_S]  # seen, then remembered
    head.close()
