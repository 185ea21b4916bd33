"""``loader.one_packer``: the float32 engines of one folder pack their weights
one at a time (several at once on few cores spin at oneDNN's barriers), never
waiting past its bound and never on one thread."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from trtspec.runtime.engine import loader  # noqa: E402


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def _holder(folder: Path) -> subprocess.Popen[bytes]:
    """Another process (a peer stub packing) holding the lock until killed."""
    script = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(folder / loader.PACKING_LOCK)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    with proc.stdout:
        assert proc.stdout.readline() == b"held\n"
    return proc


def test_a_second_packer_waits_for_the_first(tmp_path: Path, two_threads: None) -> None:
    folder = tmp_path / ".shared-weights"
    folder.mkdir()
    peer = _holder(folder)
    try:
        started = time.monotonic()
        killer = subprocess.Popen(["sh", "-c", f"sleep 0.5; kill {peer.pid}"])
        with loader.one_packer(folder) as held:
            waited = time.monotonic() - started
        killer.wait()
    finally:
        peer.kill()
        peer.wait()
    assert held
    assert waited >= 0.4  # it ran only once the peer was gone (its lock with it)


def test_it_never_waits_past_its_bound(tmp_path: Path, two_threads: None) -> None:
    folder = tmp_path / ".shared-weights"
    folder.mkdir()
    peer = _holder(folder)
    try:
        started = time.monotonic()
        with loader.one_packer(folder, wait_s=0.3) as held:
            waited = time.monotonic() - started
    finally:
        peer.kill()
        peer.wait()
    assert not held and 0.25 <= waited < 5  # packs anyway


def test_the_lock_is_released_after_the_block(tmp_path: Path, two_threads: None) -> None:
    with loader.one_packer(tmp_path / "new") as held:
        assert held
    fd = os.open(tmp_path / "new" / loader.PACKING_LOCK, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again
    finally:
        os.close(fd)


def test_one_thread_takes_no_lock(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with loader.one_packer(tmp_path / "w") as held:
            assert not held
    finally:
        torch.set_num_threads(before)
    assert not (tmp_path / "w").exists()


def test_an_unwritable_folder_packs_without_it(tmp_path: Path, two_threads: None) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with loader.one_packer(blocker / "sub") as held:  # a folder under a file
        assert not held


def test_an_engine_load_takes_the_folders_lock(
    tmp_path: Path, two_threads: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reference engine's load packs under the lock of its engines'
    ``.shared-weights`` folder: with a peer holding it, the load waits (here
    until the bound) and then loads all the same."""
    from tests.fixtures.spec_checkpoints import build_engine
    from tests.fixtures.tiny_model import make_tiny_llama

    from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine

    model = make_tiny_llama(tmp_path / "model", num_layers=1)
    engine = build_engine(model, tmp_path / "engines" / "target", "none")
    folder = tmp_path / "engines" / ".shared-weights"
    folder.mkdir(exist_ok=True)
    monkeypatch.setattr(loader, "PACKING_WAIT_S", 0.6)
    peer = _holder(folder)
    try:
        started = time.monotonic()
        loaded = ReferenceEngine.load(engine, threads=2, kv_reuse=0)
        took = time.monotonic() - started
    finally:
        peer.kill()
        peer.wait()
    assert took >= 0.55, took
    assert len(loaded.generate(GenerationRequest([1, 2, 3], 4)).output_ids) == 4
