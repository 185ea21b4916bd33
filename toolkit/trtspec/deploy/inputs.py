"""What a deployment serves, read from the built artefacts: the repository
manifest (``trtspec-repo.json``), the routing table the repository's router
holds (``router/routing.json``, optionally checked against a ``routing.yaml``),
the engine folders its engine models name, and the repository's fingerprint.
Without a built repository (a GPU spec on a machine without GPUs) the same
names come from the plan, and the repository path is where ``trtspec repo``
would write it; the fingerprint is then unknown and said so. No Click here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtspec.artifacts.repo_manifest import ROUTING_FILE
from trtspec.artifacts.routing import RoutingTable, load_routing, routing_from_rollout
from trtspec.deploy.k8s import Served, routed_variants
from trtspec.deploy.sizing import DeployError
from trtspec.fingerprint import repository_hash
from trtspec.serve.manifest import (
    MANIFEST_NAME,
    engine_models,
    read_manifest,
    resolve_repo,
    variant_models,
)

PREPROCESSING, POSTPROCESSING, ROUTER = "preprocessing", "postprocessing", "router"


def _plan_models(plan: Any, variants: list[str]) -> tuple[list[str], list[str]]:
    """Models and engine models for ``variants``, as ``trtspec repo`` names them."""
    engines: list[str] = []
    for v in variants:
        ve = plan.variants[v]
        engines += [n for n in (ve.target, ve.draft) if n and n not in engines]
    models = sorted({PREPROCESSING, POSTPROCESSING, ROUTER, *variants, *engines})
    return models, sorted(engines)


def _engine_dirs(repo: Path, engines: list[str]) -> list[str]:
    """The absolute engine folders the engine models' configs name."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    dirs: list[str] = []
    for name in engines:
        config = model_config_pb2.ModelConfig()
        path = repo / name / "config.pbtxt"
        try:
            text_format.Parse(path.read_text(encoding="utf-8"), config)
        except (OSError, text_format.ParseError) as exc:
            raise DeployError(
                f"{path}: cannot read the engine model's config ({exc})",
                "rebuild the repository with `trtspec repo SPEC`",
            ) from None
        for param in config.parameters.values():
            value = param.string_value
            if value.startswith("/") and Path(value).is_dir() and value not in dirs:
                dirs.append(value)
    return dirs


def _same_table(a: RoutingTable, b: RoutingTable) -> bool:
    return a.to_dict() == b.to_dict()


def served_from(
    spec: Any,
    plan: Any,
    *,
    repo: Path | None,
    routing_file: Path | None,
    repo_root: Path = Path("triton_repo"),
) -> Served:
    """What one instance serves. ``repo``: the built repository (authoritative);
    ``routing_file``: a ``routing.yaml`` that must match the repository's router."""
    default = float(spec.rollout.canary_percent)
    given = load_routing(routing_file, default_canary_percent=default) if routing_file else None
    if repo is None:
        table = given or routing_from_rollout(spec.rollout.fallback_variant)
        variants = routed_variants(table)
        unknown = [v for v in variants if v not in plan.variants]
        if unknown:
            raise DeployError(
                f"{routing_file or 'rollout'}: variant(s) {', '.join(unknown)} not in spec "
                f"{spec.name} (variants: {', '.join(plan.variants)})",
                "deploy the spec the routing table was measured with",
            )
        models, engines = _plan_models(plan, variants)
        where = (repo_root / spec.name).absolute()
        return Served(
            repo=str(where),
            mount_root=os.path.commonpath([str(where), str(Path(plan.root).absolute())]),
            models=models,
            engines=engines,
            variants=variants,
            routing=table,
            spec_hash=plan.spec_hash,
            repository_hash=None,
        )
    repo = resolve_repo(repo)
    if not (repo / MANIFEST_NAME).is_file():
        raise DeployError(
            f"{repo}: no {MANIFEST_NAME}; not a repository `trtspec repo` wrote",
            "pass the folder `trtspec repo SPEC` wrote (triton_repo/<spec>)",
        )
    manifest = read_manifest(repo)
    if manifest.get("spec") != spec.name:
        raise DeployError(
            f"{repo / MANIFEST_NAME}: spec: {manifest.get('spec')!r} is not {spec.name!r}",
            "pass the repository built from this spec",
        )
    routing_json = repo / ROUTER / ROUTING_FILE
    table = (
        load_routing(routing_json, default_canary_percent=default)
        if routing_json.is_file()
        else routing_from_rollout(spec.rollout.fallback_variant)
    )
    if given is not None and not _same_table(given, table):
        raise DeployError(
            f"{routing_file}: differs from the table the repository's router serves "
            f"({routing_json})",
            f"install it first: trtspec repo {spec.source_path or 'SPEC'} --routing {routing_file}",
        )
    variants = routed_variants(table)
    loaded: set[str] = {ROUTER}
    for v in variants:
        loaded.update(variant_models(repo, v))
    engines = engine_models(repo, loaded)
    engine_dirs = _engine_dirs(repo, engines)
    root = os.path.commonpath([str(repo.absolute()), *engine_dirs])
    return Served(
        repo=str(repo.absolute()),
        mount_root=root if root != "/" else str(repo.absolute().parent),
        models=sorted(loaded),
        engines=engines,
        variants=variants,
        routing=table,
        spec_hash=str(manifest.get("spec_hash") or plan.spec_hash),
        repository_hash=repository_hash(repo),
        engine_dirs=engine_dirs,
    )
