"""What to serve from a repository folder, read from ``trtspec-repo.json``.

Owns resolving ``triton_repo/`` to the one spec repository inside it, reading
the manifest (docs/design/repository.md) with errors naming the file and field, the
closure of models a ``--variant`` needs, the engine models among them, and the
TP×PP world size of TensorRT-LLM engines (which decides leader mode).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from trtspec.artifacts.repo_manifest import MANIFEST_NAME, MANIFEST_SCHEMA_VERSION, ROUTING_FILE
from trtspec.errors import ServerError
from trtspec.integrity import read_manifest as read_build_manifest
from trtspec.integrity import require_intact
from trtspec.vocab import gpu_backend


def resolve_repo(path: str | os.PathLike[str]) -> Path:
    """The repository to serve: ``path`` itself, or the one spec repository
    inside it (``trtspec repo`` writes ``triton_repo/<spec>/``), so both
    ``triton_repo/`` and ``triton_repo/<spec>`` work."""
    repo = Path(path)
    if not repo.is_dir():
        raise ServerError(
            f"model repository not found: {repo}",
            hint="pass the folder `trtspec repo` wrote (e.g. triton_repo/<spec>)",
        )
    if (repo / MANIFEST_NAME).is_file():
        return repo
    nested = sorted(p.parent for p in repo.glob(f"*/{MANIFEST_NAME}"))
    if len(nested) > 1:
        raise ServerError(
            f"{repo} holds {len(nested)} model repositories: " + ", ".join(p.name for p in nested),
            hint=f"pass one of them, e.g. {nested[0]}",
        )
    return nested[0] if nested else repo


def read_manifest(repo: Path) -> dict:
    """Load ``trtspec-repo.json`` from ``repo`` with errors naming the file."""
    path = repo / MANIFEST_NAME
    if not repo.is_dir():
        raise ServerError(
            f"model repository not found: {repo}",
            hint="pass the folder `trtspec repo` wrote (e.g. triton_repo/<spec>)",
        )
    if not path.is_file():
        raise ServerError(
            f"{path}: not found; --variant needs the manifest that `trtspec repo` writes",
            hint="serve the folder `trtspec repo` wrote, or leave out --variant to load all models",
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ServerError(
            f"{path}: not a readable JSON manifest: {exc}",
            hint="rewrite it with `trtspec repo`",
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        raise ServerError(
            f"{path}: models: missing or not an object",
            hint="rewrite it with `trtspec repo`",
        )
    version = data.get("schema_version")
    if version != MANIFEST_SCHEMA_VERSION:
        raise ServerError(
            f"{path}: schema_version: {version!r} is not supported "
            f"(this trtspec reads {MANIFEST_SCHEMA_VERSION})",
            hint="rewrite it with this version of `trtspec repo`",
        )
    return data


def variant_models(repo: Path, variant: str) -> list[str]:
    """The models ``--variant`` must load: the variant's orchestrator and the
    closure of its ``calls`` in the manifest, sorted."""
    manifest = read_manifest(repo)
    path = repo / MANIFEST_NAME
    models: dict = manifest["models"]
    variants = [str(v) for v in manifest.get("variants") or []]
    orchestrators = [
        name
        for name, info in models.items()
        if isinstance(info, dict)
        and info.get("role") == "orchestrator"
        and (info.get("variant") or name) == variant
    ]
    if variant not in variants or not orchestrators:
        raise ServerError(
            f"{path}: unknown variant {variant!r}; valid variants: "
            f"{', '.join(variants) or '(none)'}",
            hint="pass one of the valid variants to --variant",
        )
    seen: set[str] = set()
    pending = list(orchestrators)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        info = models.get(name)
        if not isinstance(info, dict):
            caller = next(
                (m for m in sorted(seen) if name in (models.get(m) or {}).get("calls", [])),
                variant,
            )
            raise ServerError(
                f"{path}: models.{caller}.calls: {name!r} is not a model in the manifest",
                hint="rewrite the manifest with `trtspec repo`",
            )
        pending.extend(str(callee) for callee in info.get("calls") or [])
    return sorted(seen)


def engine_models(repo: Path, among: Iterable[str] | None = None) -> list[str]:
    """Models with role ``engine`` in the manifest (optionally only ``among``)."""
    models = read_manifest(repo)["models"]
    wanted = set(among) if among is not None else None
    return sorted(
        name
        for name, info in models.items()
        if isinstance(info, dict)
        and info.get("role") == "engine"
        and (wanted is None or name in wanted)
    )


def engine_folders(repo: Path, among: Iterable[str] | None = None) -> list[tuple[str, Path]]:
    """``(engine model, engine folder)`` for each engine model of the manifest
    (optionally only ``among``) whose ``config.pbtxt`` names a
    ``gpt_model_path``; a model whose config cannot be read is left to
    tritonserver, which reports it precisely."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    found = []
    for name in engine_models(repo, among):
        config = model_config_pb2.ModelConfig()
        try:
            text = (repo / name / "config.pbtxt").read_text(encoding="utf-8")
            text_format.Parse(text, config)
        except (OSError, ValueError, text_format.ParseError):
            continue
        raw = (
            config.parameters["gpt_model_path"].string_value
            if "gpt_model_path" in (config.parameters)
            else ""
        )
        if raw:
            found.append((name, repo / raw))  # an absolute raw path stays itself
    return found


def verify_engines(repo: Path, among: Iterable[str] | None = None) -> int:
    """Check every engine folder served from ``repo`` (optionally only the
    engine models ``among``) against its build manifest's sizes and SHA-256
    (``trtspec.integrity``) before tritonserver loads it; raise the
    integrity error naming each changed file and the rebuild command.
    Returns how many folders were verified (a folder without a manifest, or
    a repository without ``trtspec-repo.json``, is not counted)."""
    if not (repo / MANIFEST_NAME).is_file():
        return 0
    verified = 0
    for name, folder in engine_folders(repo, among):
        manifest = read_build_manifest(folder)
        if manifest is not None and require_intact(folder, manifest, what=f"engine model {name!r}"):
            verified += 1
    return verified


def _closure(models: dict, roots: Iterable[str]) -> set[str]:
    seen: set[str] = set()
    pending = list(roots)
    while pending:
        name = pending.pop()
        if name in seen or not isinstance(models.get(name), dict):
            continue
        seen.add(name)
        pending.extend(str(c) for c in models[name].get("calls") or [])
    return seen


def fallback_covered(repo: Path, served: Iterable[str] | None = None) -> dict[str, tuple[str, ...]]:
    """``{model: (variant, …)}`` for the served models whose stub may die without
    an outage: those only speculative variants use, when the router is served
    — it sends a failing variant's routes to their fallback. Everything the
    router itself, the default variant or any route's fallback variant needs
    (read from ``router/routing.json``) is left out, as is everything when
    there is no router, manifest or readable routing table."""
    from trtspec.artifacts.routing import load_routing
    from trtspec.errors import RepoError

    if not (repo / MANIFEST_NAME).is_file():
        return {}
    models: dict = read_manifest(repo)["models"]
    wanted = set(models) if served is None else set(served)
    router = models.get("router")
    if "router" not in wanted or not isinstance(router, dict):
        return {}
    try:
        table = load_routing(repo / "router" / ROUTING_FILE)
    except (RepoError, OSError, ValueError):
        return {}
    fallbacks = {table.default_variant} | {r.fallback_variant for r in table.routes.values()}
    roots = [
        name
        for name, info in models.items()
        if isinstance(info, dict)
        and info.get("role") == "orchestrator"
        and (info.get("variant") or name) in fallbacks
    ]
    essential = _closure(models, roots) | {"router"}
    covered: dict[str, tuple[str, ...]] = {}
    for name, info in sorted(models.items()):
        if not isinstance(info, dict) or info.get("role") != "orchestrator":
            continue
        variant = str(info.get("variant") or name)
        if variant in fallbacks:
            continue
        for member in sorted(_closure(models, [name]) - essential):
            if member in wanted:
                covered[member] = (*covered.get(member, ()), variant)
    return covered


def detect_world_size(repo: Path) -> int:
    """TP×PP of the repository's TensorRT-LLM engines, read from each engine
    model's ``gpt_model_path``/``config.json``; 1 without a manifest or for
    reference engines."""
    if not (repo / MANIFEST_NAME).is_file():
        return 1
    if not gpu_backend(read_manifest(repo).get("backend")):
        return 1
    sizes: set[int] = set()
    for _name, engine_dir in engine_folders(repo):
        try:
            engine = json.loads((engine_dir / "config.json").read_text(encoding="utf-8"))
            mapping = engine["pretrained_config"]["mapping"]
            size = mapping.get("world_size") or mapping.get("tp_size", 1) * mapping.get(
                "pp_size", 1
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue  # tritonserver itself reports a broken engine model precisely
        sizes.add(int(size))
    if len(sizes) > 1:
        raise ServerError(
            f"{repo}: engine models need different TP×PP world sizes ({sorted(sizes)}); "
            "one leader-mode launch runs one world size",
            hint="build every engine with the same tp and pp, or pass --world-size",
        )
    return sizes.pop() if sizes else 1
