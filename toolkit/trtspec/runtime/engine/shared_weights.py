"""Engines that serve the same weights share their packed copy in memory.

The reference engine computes every float32 projection from a weight
reordered once into oneDNN's blocked layout (``loader.PackedLinear``). That
reordered copy is the bulk of an engine stub's memory (SmolLM2-135M: 538 MB
of its ~680 MB), it lives in memory the stub allocated for itself, and torch
offers no way to build a oneDNN tensor over a buffer of one's own choosing.
Engine models that hold the same target (the demo's ``target``,
``target_dte``, ``target_lookahead_lookahead`` and the benchmark's parity
copy ``target_dte__arm2``) each held a private copy: four times 538 MB.

``share_packed`` writes the packed bytes once to a file (one stub writes
it, holding a lock file, whole under a name of its own, then links it into
place, so an interrupted load leaves no partial file; the others wait for
it), and every stub whose packed
bytes are identical maps that file copy-on-write over its own buffer: the
page-aligned interior of each buffer is replaced, in place, by the file's
pages (``mmap(MAP_FIXED | MAP_PRIVATE)``). Nothing moves: oneDNN keeps
reading the same addresses, now backed by the page cache, which every stub
mapping the file shares; the private pages are freed. Only identical bytes
are ever mapped: the file's name is derived from a sample of the bytes, and
every region is compared in full with the stub's own bytes before it is
replaced (a stale or foreign file is left alone and the stub keeps its
copy). The weights are never written; a write would copy the page, not
change the file. The buffers live as long as the model, i.e. the stub.
The shared pages are locked in memory where the process may (``_lock``),
as the private copy's anonymous pages never left it.

Where: ``.shared-weights/`` next to the engine folders (the spec's engine
folder), one file per distinct packed model, reused across server starts.
It may be deleted at any time (a running stub keeps its mapping), never
edited in place (a stub's unwritten pages would see the edit: the file is
written read-only); a folder that cannot be written means private copies,
as before, and one warning in the server log.
``TRTSPEC_ENGINE_SHARE_WEIGHTS=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import mmap
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDER = ".shared-weights"
PAGE = mmap.PAGESIZE
_SAMPLE = 4096  # bytes of each buffer's head and tail that go into the file's name

_PROT_READ, _PROT_WRITE = mmap.PROT_READ, mmap.PROT_WRITE
_MAP_SHARED, _MAP_PRIVATE = mmap.MAP_SHARED, mmap.MAP_PRIVATE
_MAP_FIXED = 0x10  # Linux
_MAP_ANONYMOUS = 0x20  # Linux
_MAP_FAILED = ctypes.c_void_p(-1).value


def enabled() -> bool:
    value = os.environ.get("TRTSPEC_ENGINE_SHARE_WEIGHTS", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int64,
    ]
    libc.munmap.restype = ctypes.c_int
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.memcmp.restype = ctypes.c_int
    libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    libc.mlock2.restype = ctypes.c_int
    libc.mlock2.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    libc.munlock.restype = ctypes.c_int
    libc.munlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.memcpy.restype = ctypes.c_void_p
    libc.memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return libc


@dataclass(frozen=True)
class Region:
    """The whole pages inside one packed buffer, and where the file keeps
    them: each buffer has a slot of its own in the file (its size plus a page,
    page-aligned), holding the writer's buffer at the writer's offset in its
    first page, so the file's page boundaries fall where the buffer's did."""

    name: str
    address: int  # first whole page of the buffer
    length: int
    offset: int  # of that page in the file


@dataclass(frozen=True)
class Shared:
    """What ``share_packed`` did: ``file`` (None when nothing was shared),
    the bytes now backed by it, whether this stub wrote it, and why not (or
    why not all) when it did not share everything."""

    file: Path | None
    shared_bytes: int
    wrote: bool = False
    why_not: str = ""
    locked: bool = False  # kept in memory (``_lock``); not when `ulimit -l` forbids it


_M_MMAP_THRESHOLD = -3  # mallopt
_PACKING_THRESHOLD = 128 * 1024  # glibc's initial mmap threshold
_THRESHOLD_CEILING = 32 * 1024 * 1024  # DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


@contextlib.contextmanager
def page_aligned_packing() -> Iterator[None]:
    """Make the packed buffers made inside the block start at the same
    offset in a page in every stub, so that identical bytes are in
    identical pages and can be shared.

    glibc serves a large allocation from a fresh mapping (page start + a
    fixed header) only above its mmap threshold, which it raises as large
    blocks are freed (up to 32 MB); a load frees many, so later packed
    buffers came from the heap at offsets that differ from stub to stub.
    (A free heap block that fits is still used first: such a buffer keeps
    its own copy, see ``share_packed``.)
    The threshold is held at glibc's initial 128 KB while packing, then set
    to the 32 MB the dynamic threshold climbs towards (setting it ends the
    dynamic adjustment for the process)."""
    libc = ctypes.CDLL(None)
    libc.mallopt(_M_MMAP_THRESHOLD, _PACKING_THRESHOLD)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _THRESHOLD_CEILING)


def packed_buffers(model: Any) -> list[tuple[str, int, int, bytes]]:
    """(module name, address, bytes, oneDNN layout description) of every
    oneDNN-packed weight in ``model``, in module order."""
    import torch

    found = []
    for name, module in model.named_modules():
        packed = getattr(module, "packed", None)
        if packed is None or not getattr(packed, "is_mkldnn", False):
            continue
        address = int(torch.ops.mkldnn.data_ptr(packed))
        size = int(torch.ops.mkldnn._nbytes(packed))
        layout = torch.ops.mkldnn._get_mkldnn_serialized_md(packed).numpy().tobytes()
        found.append((name, address, size, layout))
    return found


def _slot(size: int) -> int:
    return -(-(size + PAGE) // PAGE) * PAGE


def _regions(buffers: list[tuple[str, int, int, bytes]]) -> list[Region]:
    regions, slot = [], 0
    for name, address, size, _ in buffers:
        page = address // PAGE * PAGE
        start = -(-address // PAGE) * PAGE
        end = (address + size) // PAGE * PAGE
        if end - start >= PAGE:
            regions.append(Region(name, start, end - start, slot + start - page))
        slot += _slot(size)
    return regions


def _key(buffers: list[tuple[str, int, int, bytes]]) -> str:
    """A name for the file from what identifies the bytes cheaply: the torch
    build, the CPU's instruction set, and each buffer's name, layout, size,
    head and tail. A collision costs nothing but the sharing: every region
    is compared in full before it is mapped."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    digest.update(torch.__version__.encode())
    digest.update(torch.backends.cpu.get_cpu_capability().encode())
    for name, address, size, layout in buffers:
        sample = min(_SAMPLE, size)
        digest.update(f"{name}:{size}:".encode() + layout)
        digest.update(ctypes.string_at(address, sample))
        digest.update(ctypes.string_at(address + size - sample, sample))
    return digest.hexdigest()


WAIT_S = 60.0  # longest wait for another stub's write
STALE_S = 30.0  # a lock its writer has not touched this long: the writer died


def _write(file: Path, buffers: list[tuple[str, int, int, bytes]]) -> bool:
    """Write every buffer into its slot of ``file``, whole (a file of this
    process's own, then a link); False when another stub wrote it. One stub
    writes at a time (``.<name>.lock``, touched after every buffer): the
    demo's four engine stubs finish packing within a second of each other,
    and four 513 MB writes of the same bytes cost the first start seconds.
    The others wait for the file (their own copy meanwhile in use), up to
    ``WAIT_S``; a lock left by a writer that died is taken over. Only a
    whole file is ever linked into place, even if two stubs end up writing."""
    lock = file.with_name(f".{file.name}.lock")
    part = file.with_name(f".{file.name}.{os.getpid()}.part")
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            break
        except FileExistsError:
            pass
        if file.is_file():
            return False
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock.stat().st_mtime > STALE_S:
                lock.unlink()  # its writer died mid-write
                continue
        if time.monotonic() > deadline:
            return False  # the caller finds no file: the model keeps its copy
        time.sleep(0.05)
    try:
        with open(part, "xb") as out:
            for _, address, size, _ in buffers:
                lead = address % PAGE
                out.write(bytes(lead))
                out.write(memoryview((ctypes.c_char * size).from_address(address)))
                out.write(bytes(_slot(size) - lead - size))
                with contextlib.suppress(OSError):
                    os.utime(lock)  # still writing
        os.chmod(part, 0o444)  # stubs map it: an edit in place would reach them
        try:
            os.link(part, file)
        except FileExistsError:
            return False
        return True
    finally:
        part.unlink(missing_ok=True)
        lock.unlink(missing_ok=True)


def share_packed(model: Any, folder: Path) -> Shared:
    """Back ``model``'s packed weights by the shared file in ``folder``
    (written first if no stub did yet). Never raises for a folder it cannot
    use or a file that does not match: whatever is not shared keeps its own
    copy. A buffer that sits at another offset in its page than in the
    writer's stub compares unequal and is not shared (see
    ``page_aligned_packing``)."""
    buffers = packed_buffers(model)
    regions = _regions(buffers)
    if not regions:
        return Shared(None, 0, why_not="no packed weights")
    total = sum(_slot(size) for _, _, size, _ in buffers)
    file = folder / f"packed-{_key(buffers)}.bin"
    wrote = False
    try:
        if not file.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            wrote = _write(file, buffers)
        fd = os.open(file, os.O_RDONLY)
    except OSError as exc:
        return Shared(None, 0, why_not=f"{folder}: {exc.strerror or exc}")
    libc = _libc()
    try:
        if os.fstat(fd).st_size != total:
            return Shared(None, 0, wrote, f"{file}: not this model's size")
        base = libc.mmap(None, total, _PROT_READ, _MAP_SHARED, fd, 0)
        if base in (None, _MAP_FAILED):
            return Shared(None, 0, wrote, f"{file}: cannot map it")
        try:
            same = [r for r in regions if libc.memcmp(r.address, base + r.offset, r.length) == 0]
            locked = bool(same) and _lockable(libc, base, total)
            for region in same:
                _overlay(libc, region, fd, base)
                if locked:
                    _lock(libc, region)
        finally:
            libc.munmap(base, total)
    finally:
        os.close(fd)
    if not same:
        return Shared(None, 0, wrote, f"{file}: other bytes than this model's")
    missed = len(regions) - len(same)
    why = f"{missed} of {len(regions)} buffers differ from the file's" if missed else ""
    return Shared(file, sum(r.length for r in same), wrote, why, locked)


_MLOCK_ONFAULT = 1


def _lockable(libc: Any, base: int, total: int) -> bool:
    """Whether this process may lock ``total`` bytes (tried on the file's
    own mapping, locked on fault only, so nothing is read). A process
    without CAP_IPC_LOCK may lock `ulimit -l` (often 8 MiB): its engine
    shares unlocked, its pages as evictable as any memory-mapped model's."""
    if libc.mlock2(base, total, _MLOCK_ONFAULT) != 0:
        return False
    libc.munlock(base, total)
    return True


def _lock(libc: Any, region: Region) -> None:
    """Keep the region's pages in memory, as the private copy's were.

    A private copy is anonymous memory, which without swap is never paged
    out; file pages are, when the kernel reclaims idle memory (this
    machine's DAMON pages out whatever was not touched for a minute, and its
    disk reads ~30 MB/s): an engine idle for minutes would read its weights
    back from disk on the next request. The pages are locked as they are
    faulted (``MLOCK_ONFAULT``: locking a writable private mapping outright
    would fault every page for writing, i.e. copy it) and then read once, so
    each is the page cache's page, shared and locked."""
    if libc.mlock2(region.address, region.length, _MLOCK_ONFAULT) != 0:
        return
    import numpy as np

    pages = np.frombuffer(
        memoryview((ctypes.c_uint8 * region.length).from_address(region.address)), dtype=np.uint8
    )
    int(pages[::PAGE].sum())  # a read fault on every page


def _overlay(libc: Any, region: Region, fd: int, base: int) -> None:
    """Replace the region's pages by the file's, at the same address."""
    got = libc.mmap(
        region.address,
        region.length,
        _PROT_READ | _PROT_WRITE,
        _MAP_PRIVATE | _MAP_FIXED,
        fd,
        region.offset,
    )
    if got == region.address:
        return
    # Linux may have unmapped the range before failing: put anonymous memory
    # back and copy the bytes into it, so the model stays whole.
    got = libc.mmap(
        region.address,
        region.length,
        _PROT_READ | _PROT_WRITE,
        _MAP_PRIVATE | _MAP_FIXED | _MAP_ANONYMOUS,
        -1,
        0,
    )
    if got != region.address:
        raise OSError(ctypes.get_errno(), f"cannot restore the packed weight {region.name}")
    libc.memcpy(region.address, base + region.offset, region.length)
