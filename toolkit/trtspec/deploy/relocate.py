"""A model repository moved to another root, as a pod sees it. ``trtspec
repo`` writes absolute paths into the models' ``config.pbtxt`` (engine folders,
tokenizer folders); on a cluster the volume holding the repository and its
engines is mounted at a path of the image's choosing (``/models``), not at the
builder's folder. ``relocate`` copies the repository (configs, Python models,
routing table: kilobytes; the engines stay where they are on the volume) into
a writable folder and rewrites every string parameter under the old root to
the same place under the new one (paths outside it, such as the executor
worker inside the image, stay), and refuses to finish when a moved path is
not on the volume.
The generated pods run it as an init container
(``python3 -m trtspec.deploy.relocate``), so the manifests carry the rewrite
and nothing on the volume changes; given the fingerprint the deployment was
made from, it first checks that the volume holds that repository. No Click.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from trtspec.artifacts.repo_manifest import ROUTING_FILE

CONFIG = "config.pbtxt"
# A string parameter value in config.pbtxt text format: `string_value: "..."`.
_STRING = re.compile(r'(string_value:\s*")((?:[^"\\]|\\.)*)(")')


class RelocateError(Exception):
    """The repository cannot be moved as asked."""


def rewrite_config(text: str, old_root: str, new_root: str) -> tuple[str, list[str]]:
    """``text`` with every string value under ``old_root`` moved under
    ``new_root``, and the values rewritten."""
    old = old_root.rstrip("/") or "/"
    changed: list[str] = []

    def move(m: re.Match[str]) -> str:
        value = m.group(2)
        if value == old or value.startswith(old.rstrip("/") + "/"):
            rel = os.path.relpath(value, old)
            new = new_root if rel == "." else f"{new_root.rstrip('/')}/{rel}"
            changed.append(value)
            return f"{m.group(1)}{new}{m.group(3)}"
        return m.group(0)

    return _STRING.sub(move, text), changed


def absolute_values(text: str) -> list[str]:
    """Every absolute path among a config's string values."""
    return [m.group(2) for m in _STRING.finditer(text) if m.group(2).startswith("/")]


def relocate(repo: Path, out: Path, old_root: str, new_root: str) -> list[str]:
    """Copy ``repo`` to ``out`` with its configs' paths moved from
    ``old_root`` to ``new_root``; returns the rewritten values. Every moved
    path must exist under ``new_root`` (the volume is mounted there)."""
    repo, out = Path(repo), Path(out)
    if not repo.is_dir():
        raise RelocateError(f"{repo}: no model repository here (is the volume populated?)")
    changed: list[str] = []
    missing: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    for src in sorted(repo.rglob("*")):
        dst = out / src.relative_to(repo)
        if src.is_dir():
            dst.mkdir(parents=True, exist_ok=True)
            continue
        if src.name != CONFIG:
            shutil.copyfile(src, dst)
            continue
        text, moved = rewrite_config(src.read_text(encoding="utf-8"), old_root, new_root)
        for value in moved:
            rel = os.path.relpath(value, old_root)
            if not os.path.exists(os.path.join(new_root, rel)):
                missing.append(f"{src.relative_to(repo)}: {value} (looked in {new_root}/{rel})")
        changed += moved
        dst.write_text(text, encoding="utf-8")
    if missing:
        raise RelocateError("not on the volume: " + "; ".join(missing))
    return changed


def check_fingerprint(repo: Path, expected: str) -> None:
    """The repository on the volume must be the one the deployment was made
    from (``trtspec.fingerprint.repository_hash``, the hash the benchmark recorded)."""
    from trtspec.fingerprint import repository_hash

    found = repository_hash(Path(repo))
    if found != expected:
        raise RelocateError(
            f"{repo}: repository fingerprint {found}, but the deployment was made from "
            f"{expected}: the volume holds another build (copy the repository again)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m trtspec.deploy.relocate")
    parser.add_argument("repo", type=Path, help="the repository on the mounted volume")
    parser.add_argument("out", type=Path, help="the writable folder tritonserver reads")
    parser.add_argument("--from-root", required=True, help="the folder the builder wrote")
    parser.add_argument("--to-root", required=True, help="where the volume is mounted")
    parser.add_argument("--expect-hash", help="the repository fingerprint the deployment names")
    parser.add_argument(
        "--routing", type=Path, help="a routing.json to serve instead of the repository's"
    )
    args = parser.parse_args(argv)
    try:
        if args.expect_hash:
            check_fingerprint(args.repo, args.expect_hash)
        changed = relocate(args.repo, args.out, args.from_root, args.to_root)
        if args.routing is not None:  # one gateway pool's table (trtspec.deploy.gateway)
            shutil.copyfile(args.routing, args.out / "router" / ROUTING_FILE)
    except (RelocateError, OSError) as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    print(f"relocated {args.repo} -> {args.out}: {len(changed)} paths under {args.to_root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
