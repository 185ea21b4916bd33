"""Hostile rollout states without a server (issue 44): every state the
router reads is validated (``rollout_state.validate_state``: a known schema
version, this routing table's digest, per route a finite share from 0 to
100 and a known status; a link out of the folder, a FIFO and an oversized
file refused). The router's watcher refuses an invalid one with one log line
and one count per version of the file and keeps its last good table (at the
start, with none, every route on its fallback); ``trtspec rollout status``
names the problem and exits 1; ``advance`` and ``rollback`` never write
one. The served check is in tests/integration/test_rollout_served.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from tests.fixtures.rollout_states import HOSTILE, state_text, write_good, write_hostile
from tests.unit.test_rollout import _router, _run, _served_repo

from trtspec.artifacts import rollout_state as st
from trtspec.errors import RepoError


def _watch(tmp_path: Path) -> tuple[Path, st.StateWatcher, list[str], list[int]]:
    router, table = _router(tmp_path)
    folder = router / "rollout"
    folder.mkdir(exist_ok=True)
    warnings: list[str] = []
    refused: list[int] = []
    watcher = st.StateWatcher(
        table,
        router / "routing.json",
        folder,
        warn=warnings.append,
        refused=lambda: refused.append(1),
    )
    return folder, watcher, warnings, refused


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_state_is_refused_and_the_last_good_one_kept(tmp_path: Path, name: str) -> None:
    folder, watcher, warnings, refused = _watch(tmp_path)
    write_good(folder, watcher.digest, "code", 25)
    assert watcher.refresh(force=True).routes["code"].canary_percent == 25.0
    words = write_hostile(folder, name, watcher.digest, "code")
    with pytest.raises(RepoError) as caught:
        st.read_state(folder / st.STATE_FILE, watcher.digest)
    assert caught.value.message == words
    for _ in range(3):  # one line and one count for this version of the file
        assert watcher.refresh(force=False).routes["code"].canary_percent == 25.0
        watcher._next = 0.0
    assert watcher.refresh(force=True).routes["code"].canary_percent == 25.0
    assert warnings[0] == f"rollout: refused {words}; keeping the last good state"
    assert len(set(warnings)) == 1 and len(refused) == len(warnings)
    write_good(folder, watcher.digest, "code", 50)  # a valid state applies again
    assert watcher.refresh(force=True).routes["code"].canary_percent == 50.0


def test_at_the_start_an_invalid_state_leaves_every_route_on_its_fallback(
    tmp_path: Path,
) -> None:
    router, table = _router(tmp_path)
    folder = router / "rollout"
    folder.mkdir()
    write_hostile(folder, "nan", st.routing_digest(router / "routing.json"), "code")
    warnings: list[str] = []
    watcher = st.StateWatcher(table, router / "routing.json", folder, warn=warnings.append)
    assert watcher.table().routes["code"].canary_percent == 0.0
    assert warnings[0].endswith("; every route on its fallback until a valid state is written")


def test_a_configmap_layout_is_read_and_a_fifo_refused_without_blocking(tmp_path: Path) -> None:
    folder, watcher, warnings, _ = _watch(tmp_path)
    # kubelet's layout: state.json -> ..data/state.json, ..data -> ..<timestamp>
    stamp = folder / "..2026_12_04_20_00_00.000000001"
    stamp.mkdir()
    (stamp / st.STATE_FILE).write_text(state_text(watcher.digest, "code", "50"))
    (folder / "..data").symlink_to(stamp.name)
    (folder / st.STATE_FILE).symlink_to(f"..data/{st.STATE_FILE}")
    assert watcher.refresh(force=True).routes["code"].canary_percent == 50.0
    assert not warnings
    (folder / st.STATE_FILE).unlink()
    os.mkfifo(folder / st.STATE_FILE)
    with pytest.raises(RepoError, match="not a regular file of at most 1048576 bytes"):
        st.read_state(folder / st.STATE_FILE)
    assert watcher.refresh(force=True).routes["code"].canary_percent == 50.0


def test_json_nested_past_the_parsers_limit_is_refused_not_a_crash(tmp_path: Path) -> None:
    repo = _served_repo(tmp_path, canary_ms=5.0)
    (repo / "router" / "rollout" / st.STATE_FILE).write_text("[" * 200_000)
    got = _run("status", str(repo))
    assert got.exit_code == 1, got.output
    assert "state.json: not valid JSON: maximum recursion depth exceeded" in got.stderr
    assert "unexpected" not in got.output


def test_a_dangling_link_out_of_the_folder_is_refused_too(tmp_path: Path) -> None:
    folder, watcher, warnings, refused = _watch(tmp_path)
    write_good(folder, watcher.digest, "code", 25)
    watcher.refresh(force=True)
    (folder / st.STATE_FILE).unlink()
    (folder / st.STATE_FILE).symlink_to(tmp_path / "nowhere.json")
    assert watcher.refresh(force=True).routes["code"].canary_percent == 25.0
    assert "outside" in warnings[0] and refused == [1]


@pytest.mark.parametrize("name", HOSTILE)
def test_rollout_status_names_the_problem_and_exits_1(tmp_path: Path, name: str) -> None:
    repo = _served_repo(tmp_path, canary_ms=5.0)
    folder = repo / "router" / "rollout"
    words = write_hostile(folder, name, st.routing_digest(repo / "router/routing.json"), "code")
    got = _run("status", str(repo))
    assert got.exit_code == 1, got.output
    assert got.stderr.startswith(f"Error: {words}\n"), got.stderr
    hint = "Write the state in" if name == "link elsewhere" else "Set it with `trtspec rollout"
    assert f"\nHint: {hint}" in got.stderr, got.stderr
    assert "Traceback" not in got.output and "unexpected" not in got.output
    before = os.readlink(folder / st.STATE_FILE) if name == "link elsewhere" else None
    text = (folder / st.STATE_FILE).read_text()
    for args in (("advance", "code", "--force"), ("rollback", "code")):
        moved = _run(*args, str(repo))
        assert moved.exit_code == 1, moved.output
        assert moved.stderr.startswith(f"Error: {words}\n"), moved.stderr
    # nothing was written over it, nothing recorded
    assert (folder / st.STATE_FILE).read_text() == text
    if before is not None:
        assert os.readlink(folder / st.STATE_FILE) == before
    assert st.read_history(folder) == []


@pytest.mark.parametrize(
    "percent",
    [float("nan"), float("inf"), 150.0, -50.0, 10**400, "50"],
    ids=["nan", "inf", "150", "-50", "400 digits", "a string"],
)
def test_change_never_writes_a_state_the_router_would_refuse(tmp_path: Path, percent) -> None:
    router, table = _router(tmp_path)
    folder = router / "rollout"
    with pytest.raises(RepoError, match=r"routes\.code\.percent: must be a number from 0 to 100"):
        st.change(
            folder,
            router / "routing.json",
            table,
            "code",
            percent=percent,
            status=st.RAMPING,
            action="advance",
            by="ana",
            why="a typo",
        )
    assert not (folder / st.STATE_FILE).exists() and st.read_history(folder) == []


def test_a_ramp_step_out_of_range_is_never_written(tmp_path: Path) -> None:
    """``rollout.json``'s steps are where ``advance`` goes: a hand-edited
    step of 150 is refused at the write, not applied."""
    repo = _served_repo(tmp_path, canary_ms=5.0)
    config = repo / "router" / st.CONFIG_FILE
    data = json.loads(config.read_text())
    config.write_text(json.dumps({**data, "steps": [150]}))
    got = _run("advance", "code", str(repo), "--force")
    assert got.exit_code == 1, got.output
    assert "routes.code.percent: must be a number from 0 to 100, got 150" in got.stderr
    assert not (repo / "router" / "rollout" / st.STATE_FILE).exists()


def test_a_state_for_another_routing_table_is_replaced_by_a_change(tmp_path: Path) -> None:
    """Stale (another table's digest) is not invalid: ``change`` starts
    afresh from this table, as before."""
    router, table = _router(tmp_path)
    folder = router / "rollout"
    folder.mkdir()
    (folder / st.STATE_FILE).write_text(state_text("0" * 64, "code", "100"))
    entry = st.change(
        folder,
        router / "routing.json",
        table,
        "code",
        percent=25,
        status=st.RAMPING,
        action="advance",
        by="ana",
        why="next step",
    )
    assert entry is not None and (entry["from_percent"], entry["to_percent"]) == (5.0, 25.0)
    state = st.read_state(folder / st.STATE_FILE, st.routing_digest(router / "routing.json"))
    assert state is not None and state.routes["code"].percent == 25.0


def test_an_automatic_rollback_over_an_invalid_state_still_takes_the_route_off(
    tmp_path: Path,
) -> None:
    """The router's own rollback (a golden mismatch, a breach) may not write
    over an invalid state either: the route goes to its fallback in the
    router anyway (``Live.pending``), the file stays as it was, the server
    log says so, and the rollback is recorded once the state is valid."""
    import types

    from trtspec.runtime.models.rollout_live import Live

    said: list[str] = []
    pb = types.SimpleNamespace(Logger=types.SimpleNamespace(log_warn=said.append))
    router, table = _router(tmp_path)
    folder = router / "rollout"
    folder.mkdir()
    digest = st.routing_digest(router / "routing.json")
    write_good(folder, digest, "code", 25)
    live = Live(router, router / "routing.json", table, pb, st.RolloutConfig())
    try:
        assert live.table().routes["code"].canary_percent == 25.0
        words = write_hostile(folder, "nan", digest, "code")
        text = (folder / st.STATE_FILE).read_text()
        assert live.rollback(live.table(), "code", "golden prompt 0 differs", {}) is None
        assert live.table().routes["code"].canary_percent == 0.0
        assert (folder / st.STATE_FILE).read_text() == text and st.read_history(folder) == []
        assert words in said[-1] and "could not be recorded" in said[-1], said[-1]
        write_good(folder, digest, "code", 25)  # fixed by hand
        assert live.table().routes["code"].canary_percent == 0.0  # still rolled back here
        entry = live._persist("code")
        assert entry is not None and entry["to_percent"] == 0.0
        state = st.read_state(folder / st.STATE_FILE)
        assert state is not None and state.routes["code"] == st.RouteState(0.0, st.ROLLED_BACK)
    finally:
        live.close()
