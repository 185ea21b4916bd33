"""Whether a built folder still holds what its ``trtspec.json`` manifest says.

The executor records every file of a unit (engine folder, converted
checkpoint) in the manifest's ``files``: its size, and a SHA-256 for files up
to ``HASH_MAX_BYTES``. The build cache, ``trtspec inspect`` and ``trtspec repo
--check`` compare a folder against that record, so a deleted or truncated
weight file is caught before a server tries to load it.

Large files are checked by size only: engines and weight shards run to many
GB, SHA-256 runs at a few hundred MB/s per core (360 MB/s measured on the
2-core CI machine), and these checks run on every ``build``, ``inspect`` and
``repo --check`` — hashing a 14 GB engine would add about 40 s to each. A
same-size corruption of a large file is therefore not detected; a missing or
truncated one is. Configs, tokenizer files and logs are small and hashed.

A manifest written before ``files`` existed (``schema_version`` 1) cannot be
verified; callers treat it as *unverifiable*, say so, and keep trusting the
step cache keys as before rather than rebuilding engines that may have taken
hours (``trtspec build --force`` records the files).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from trtspec.artifacts.engine_manifest import MANIFEST
from trtspec.errors import TrtspecError

HASH_MAX_BYTES = 16 * 1024 * 1024
_CHUNK = 1024 * 1024


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(folder: Path) -> list[tuple[str, Path]]:
    out = []
    for root, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            path = Path(root) / name
            rel = path.relative_to(folder).as_posix()
            if rel != MANIFEST:
                out.append((rel, path))
    return out


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """``{relative path: {"size": bytes, "sha256": hex or None}}`` for every
    file under ``folder`` but the manifest; sha256 only up to HASH_MAX_BYTES."""
    records: dict[str, dict[str, Any]] = {}
    for rel, path in _files(folder):
        size = path.stat().st_size
        records[rel] = {"size": size, "sha256": _sha256(path) if size <= HASH_MAX_BYTES else None}
    return records


def verify_files(folder: Path, manifest: dict[str, Any]) -> list[tuple[str, str]] | None:
    """Problems of ``folder`` against ``manifest["files"]``, one ``(file,
    problem)`` per file (``("rank0.engine", "missing")`` …); ``[]`` when all
    match; ``None`` when the manifest records no files (written by an older
    trtspec: unverifiable). Files added since the build are not problems."""
    recorded = manifest.get("files")
    if not isinstance(recorded, dict):
        return None
    problems: list[tuple[str, str]] = []
    for rel, record in sorted(recorded.items()):
        path = folder / rel
        if not isinstance(record, dict):
            problems.append((rel, f"unreadable record in {MANIFEST}"))
            continue
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            problems.append((rel, "missing"))
            continue
        except OSError as exc:
            problems.append((rel, f"cannot be read ({exc.strerror})"))
            continue
        want = record.get("size")
        if not isinstance(want, int):
            problems.append((rel, f"no size recorded in {MANIFEST}"))
            continue
        if size != want:
            shorter = " (truncated?)" if size < want else ""
            problems.append((rel, f"{size:,} bytes, but {want:,} when built{shorter}"))
            continue
        digest = record.get("sha256")
        if digest is not None:
            try:
                changed = _sha256(path) != digest
            except OSError as exc:
                problems.append((rel, f"cannot be read ({exc.strerror})"))
                continue
            if changed:
                problems.append((rel, "content changed since the build (sha256 differs)"))
    return problems


def require_intact(folder: Path, manifest: dict[str, Any], *, what: str = "") -> bool:
    """Raise ``TrtspecError`` naming every file of ``folder`` that no longer
    matches ``manifest`` and how to rebuild it; ``True`` when all match,
    ``False`` when the manifest records no files (unverifiable). ``what``
    names the folder's role in the message (``engine 'target' of …``)."""
    problems = verify_files(folder, manifest)
    if problems:
        role = f" ({what})" if what else ""
        raise TrtspecError(
            f"{folder}{role}: {len(problems)} file(s) no longer match its {MANIFEST}:\n  "
            + "\n  ".join(describe(problems)),
            rebuild_hint(manifest),
        )
    return problems is not None


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """``folder``'s build manifest, or ``None`` when it has none (not built
    by trtspec: nothing recorded to compare with) or it is not a JSON object."""
    try:
        data = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def describe(problems: list[tuple[str, str]]) -> list[str]:
    return [f"{rel}: {why}" for rel, why in problems]


def rebuild_hint(manifest: dict[str, Any]) -> str:
    """How to rebuild the unit a manifest describes."""
    engine = manifest.get("engine")
    variants = engine.get("variants") if isinstance(engine, dict) else None
    spec = manifest.get("spec") or "the spec"
    only = f" --only {variants[0]}" if isinstance(variants, list) and variants else ""
    return f"rebuild it: `trtspec build SPEC --force{only}` (SPEC: the spec file of {spec!r})"


def unverifiable_note(folder: Path) -> str:
    return (
        f"{folder}: its {MANIFEST} was written by an older trtspec and records no files, so "
        "missing or truncated files cannot be detected; `trtspec build SPEC --force` records them"
    )
