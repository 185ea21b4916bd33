"""Engines that serve the same weights share one packed copy
(runtime/engine/shared_weights.py): the packed bytes are written once, whole, and
every engine whose bytes are identical maps that file over its own buffers;
a file with other bytes, a folder that cannot be written and a write that
fails leave the engine with its own copy and no file behind. The tokens do
not change (checked against an engine loaded with sharing off)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from trtspec.runtime.engine import shared_weights
from trtspec.runtime.engine.decode import GenerationRequest, ReferenceEngine
from trtspec.runtime.engine.loader import _packed_linear_class

PROMPT = [5, 17, 33, 2, 99, 41, 7, 250, 12]


def _mapped_ranges(file: Path) -> list[tuple[int, int]]:
    """Address ranges of this process that map ``file``."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith(str(file)):
            start, end = line.split()[0].split("-")
            ranges.append((int(start, 16), int(end, 16)))
    return ranges


def _covered(model, file: Path) -> bool:
    """Whether the whole pages of every packed buffer of ``model`` map ``file``."""
    ranges = _mapped_ranges(file)
    regions = shared_weights._regions(shared_weights.packed_buffers(model))
    return bool(regions) and all(
        any(lo <= r.address and r.address + r.length <= hi for lo, hi in ranges) for r in regions
    )


def _mapped_kb(file: Path) -> dict[str, int]:
    """Locked, Anonymous (copied on write) and Rss kB of this process's
    mappings of ``file``, from smaps."""
    fields = {"Locked": 0, "Anonymous": 0, "Rss": 0}
    mapped = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if "-" in line.split(" ")[0] and len(line.split()) >= 5:  # a mapping's first line
            mapped = line.endswith(str(file))
        elif mapped and line.split(":")[0] in fields:
            fields[line.split(":")[0]] += int(line.split()[1])
    return fields


@pytest.fixture(scope="module")
def wide_engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two engines (none, draft_tokens_external) of one model whose packed
    buffers exceed glibc's 128 KB mmap threshold, as a real model's do (the
    session's tiny model's are 32 KB: heap blocks at any offset)."""
    from tests.fixtures.spec_checkpoints import build_engine
    from tests.fixtures.tiny_model import make_tiny_llama

    root = tmp_path_factory.mktemp("wide")
    model = make_tiny_llama(root / "model", hidden_size=256, num_layers=1)
    return {
        "none": build_engine(model, root / "engines" / "target", "none"),
        "dte": build_engine(
            model, root / "engines" / "target_dte", "draft_tokens_external", max_draft_len=4
        ),
    }


# run in a fresh interpreter; argv: engine folder, prompt, this file (its helpers)
_LOAD = """
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("shared_weights_tests", sys.argv[3])
t = importlib.util.module_from_spec(spec)
spec.loader.exec_module(t)
engine = t.ReferenceEngine.load(Path(sys.argv[1]), threads=1, kv_reuse=0)
shared = engine.model._trtspec_shared
tokens = engine.generate(t.GenerationRequest(json.loads(sys.argv[2]), 16)).output_ids
mapped = shared.file is not None
print(json.dumps({
    "file": str(shared.file), "bytes": shared.shared_bytes, "wrote": shared.wrote,
    "why_not": shared.why_not, "locked": shared.locked, "tokens": tokens,
    "covered": mapped and t._covered(engine.model, shared.file),
    "kb": t._mapped_kb(shared.file) if mapped else {"Locked": 0, "Anonymous": 0, "Rss": 0},
}))
"""


def _may_lock(size: int) -> bool:
    """Whether a process like this one may lock ``size`` bytes: CAP_IPC_LOCK
    (bit 14 of CapEff) or a `ulimit -l` that allows it."""
    import resource

    status = Path("/proc/self/status").read_text()
    caps = int(next(x.split()[1] for x in status.splitlines() if x.startswith("CapEff")), 16)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return bool(caps >> 14 & 1) or soft == resource.RLIM_INFINITY or soft >= size


def _load_in_a_stub(engine: Path, prefix: tuple[str, ...] = ()) -> dict:
    """Load ``engine`` in a fresh interpreter, as a Triton stub does (a
    long-lived test process's heap would place the buffers differently)."""
    import json
    import subprocess
    import sys

    out = subprocess.run(
        [*prefix, sys.executable, "-c", _LOAD, str(engine), json.dumps(PROMPT), __file__],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def stubs(wide_engines: dict[str, Path]) -> dict[str, dict]:
    """The two engines loaded one after the other in fresh interpreters:
    the first writes the file, the second maps it."""
    return {name: _load_in_a_stub(wide_engines[name]) for name in ("none", "dte")}


def test_engines_of_the_same_weights_map_one_file_and_keep_their_tokens(
    wide_engines: dict[str, Path], stubs: dict[str, dict], monkeypatch
) -> None:
    monkeypatch.setenv("TRTSPEC_ENGINE_SHARE_WEIGHTS", "0")
    own = ReferenceEngine.load(wide_engines["none"], threads=1, kv_reuse=0)
    assert own.model._trtspec_shared == shared_weights.Shared(None, 0, why_not="off")
    want = own.generate(GenerationRequest(PROMPT, 16)).output_ids
    monkeypatch.delenv("TRTSPEC_ENGINE_SHARE_WEIGHTS")

    a, b = stubs["none"], stubs["dte"]
    folder = wide_engines["none"].parent / shared_weights.FOLDER
    assert a["wrote"] and not a["why_not"] and Path(a["file"]).parent == folder, a
    assert (b["file"], b["wrote"]) == (a["file"], False), b
    assert a["locked"] == b["locked"] == _may_lock(a["bytes"] + 2**20)
    # Now and then glibc still serves a buffer from a free heap block (at
    # another offset in its page) in one of the stubs: that buffer stays
    # private, the rest is shared (the demo's stubs: 508–513 of 513 MiB).
    assert b["bytes"] == a["bytes"] or (
        b["bytes"] >= 0.75 * a["bytes"] and b["why_not"].endswith("differ from the file's")
    ), b
    assert a["bytes"] >= 1_000_000  # every projection and the LM head
    assert a["covered"] and (b["covered"] or b["bytes"] < a["bytes"])
    for stub in (a, b):  # every shared page resident and locked (where allowed), not copied
        kb = stub["kb"]
        assert kb["Anonymous"] == 0, kb
        if stub["locked"]:
            assert kb["Locked"] == kb["Rss"] >= stub["bytes"] // 1024, kb
    assert [p.name for p in folder.iterdir()] == [Path(a["file"]).name]  # nothing else left
    assert a["tokens"] == b["tokens"] == want


@pytest.mark.skipif(
    not (shutil.which("setpriv") and shutil.which("prlimit")), reason="needs setpriv, prlimit"
)
def test_an_engine_that_may_not_lock_its_pages_shares_them_unlocked(
    wide_engines: dict[str, Path], stubs: dict[str, dict]
) -> None:
    """Without CAP_IPC_LOCK and under a small `ulimit -l` the pages are
    shared but not locked (file pages, evictable like any memory-mapped
    model's); the tokens are the same."""
    prefix = ("prlimit", "--memlock=65536", "setpriv", "--inh-caps=-ipc_lock")
    prefix += ("--bounding-set=-ipc_lock",)
    if os.geteuid() != 0:
        prefix = ("prlimit", "--memlock=65536")
    stub = _load_in_a_stub(wide_engines["none"], prefix)
    locked = stubs["none"]
    assert stub["file"] == locked["file"] != "None" and stub["bytes"] > 0
    assert not stub["locked"] and locked["locked"] == _may_lock(locked["bytes"] + 2**20)
    assert stub["kb"]["Locked"] == 0 and stub["kb"]["Anonymous"] == 0
    assert stub["tokens"] == locked["tokens"]


def _packed_model(seed: int = 0) -> torch.nn.Module:
    """Two packed projections large enough for whole pages, built as the
    loader builds them (page_aligned_packing)."""
    torch.manual_seed(seed)
    packed = _packed_linear_class()
    with shared_weights.page_aligned_packing():
        return torch.nn.Sequential(
            packed(torch.nn.Linear(256, 512), keep_dense=False),
            packed(torch.nn.Linear(512, 256), keep_dense=False),
        )


def _corrupted_copy(file: Path, folder: Path, positions: list[int]) -> Path:
    copy = folder / file.name
    folder.mkdir(exist_ok=True)
    data = bytearray(file.read_bytes())
    for position in positions:
        data[position] ^= 0xFF
    copy.unlink(missing_ok=True)  # never edit a shared file in place: its mappers see it
    copy.write_bytes(bytes(data))
    return copy


def test_bytes_that_differ_from_the_file_are_never_mapped(tmp_path: Path) -> None:
    """The same model shared twice (so its buffers' offsets are the
    writer's): against a copy of its file with a byte changed in every
    page nothing is mapped; with one byte changed in the second buffer's
    pages only the first buffer is."""
    model = _packed_model()
    x = torch.randn(3, 256)
    want = model(x)
    shared = shared_weights.share_packed(model, tmp_path / "a")
    assert shared.wrote and shared.file is not None and not shared.why_not
    regions = shared_weights._regions(shared_weights.packed_buffers(model))
    size = shared.file.stat().st_size

    every_page = list(range(100, size, shared_weights.PAGE))
    other = _corrupted_copy(shared.file, tmp_path / "b", every_page)
    refused = shared_weights.share_packed(model, tmp_path / "b")
    assert refused.file is None and "other bytes" in refused.why_not
    assert not _mapped_ranges(other)
    assert torch.equal(model(x), want)

    second = regions[1]
    other = _corrupted_copy(shared.file, tmp_path / "c", [second.offset + second.length // 2])
    partial = shared_weights.share_packed(model, tmp_path / "c")
    assert partial.file == other and partial.shared_bytes == regions[0].length
    assert partial.why_not == "1 of 2 buffers differ from the file's"
    [(lo, hi)] = _mapped_ranges(other)
    assert lo <= regions[0].address and regions[0].address + regions[0].length <= hi
    assert not lo <= second.address < hi
    assert torch.equal(model(x), want)


def test_a_folder_that_cannot_be_used_leaves_the_model_its_copy(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    model = _packed_model()
    x = torch.randn(2, 256)
    want = model(x)
    shared = shared_weights.share_packed(model, blocker / shared_weights.FOLDER)
    assert shared.file is None and str(blocker) in shared.why_not
    assert torch.equal(model(x), want)


def test_a_failed_write_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_weights.os, "link", full_disk)
    model = _packed_model()
    shared = shared_weights.share_packed(model, tmp_path)
    assert shared.file is None and "No space left" in shared.why_not
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_other_weights_get_a_file_of_their_own(tmp_path: Path, seed: int) -> None:
    base = shared_weights.share_packed(_packed_model(0), tmp_path)
    other = shared_weights.share_packed(_packed_model(seed), tmp_path)
    assert base.file is not None and other.file is not None and other.file != base.file


def test_the_build_clears_the_folder_the_engines_use() -> None:
    """`trtspec build` removes it when it rebuilds an engine next to it
    (tests/unit/test_build_executor.py); it must be this folder."""
    from trtspec.build.executor import SHARED_WEIGHTS

    assert SHARED_WEIGHTS == shared_weights.FOLDER


def test_one_stub_writes_and_the_others_wait_for_its_file(tmp_path: Path) -> None:
    """A lock file makes one stub the writer: a stub that finds another's
    write under way waits for the file and maps it (the demo's four engine
    stubs finish packing together); a lock left untouched by a writer that
    died is taken over; nothing but the file is left behind."""
    import threading
    import time

    model = _packed_model()
    first = shared_weights.share_packed(model, tmp_path / "x")
    assert first.wrote and first.file is not None
    name = first.file.name
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [name]

    waiting = tmp_path / "y"
    waiting.mkdir()
    lock = waiting / f".{name}.lock"
    lock.write_bytes(b"")

    def finish_the_write() -> None:
        time.sleep(0.3)
        os.link(first.file, waiting / name)
        lock.unlink()

    writer = threading.Thread(target=finish_the_write)
    started = time.monotonic()
    writer.start()
    shared = shared_weights.share_packed(model, waiting)
    writer.join()
    assert time.monotonic() - started >= 0.3
    assert shared.file == waiting / name and not shared.wrote
    assert shared.shared_bytes == first.shared_bytes

    dead = tmp_path / "z"
    dead.mkdir()
    stale = dead / f".{name}.lock"
    stale.write_bytes(b"")
    old = time.time() - shared_weights.STALE_S - 5
    os.utime(stale, (old, old))
    taken = shared_weights.share_packed(model, dead)
    assert taken.wrote and taken.file == dead / name
    assert sorted(p.name for p in dead.iterdir()) == [name]
    assert (dead / name).read_bytes() == first.file.read_bytes()
