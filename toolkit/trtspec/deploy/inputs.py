"""What a deployment serves, read from the built artefacts: the repository
manifest (``trtspec-repo.json``), the routing table the repository's router
holds (``router/routing.json``, optionally checked against a ``routing.yaml``),
the engine folders its engine models name, and the repository's fingerprint.
Without a built repository (a GPU spec on a machine without GPUs) the same
names come from the plan, and the repository path is where ``trtspec repo``
would write it; the fingerprint is then unknown and said so. Also read here:
what each served engine's build recorded (``trtspec.json``'s versions: the
TensorRT-LLM version and the GPU it was built on; ``config.json``'s
``mapping.gpus_per_node``), and the folder that holds the repository and
every engine (the volume's root: refused when only ``/`` does). Variants
without a routing table are refused unless the caller asks for the baseline
only. No Click here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trtspec.artifacts.engine_manifest import MANIFEST as ENGINE_MANIFEST
from trtspec.artifacts.repo_manifest import ROUTING_FILE
from trtspec.artifacts.routing import RoutingTable, load_routing, routing_from_rollout
from trtspec.catalogue import BASELINE
from trtspec.deploy.options import Served
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
    """The absolute folders on this machine the models' configs name (engine
    and tokenizer folders): the volume must hold them all."""
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
    return [d for d in dirs if not any(d.startswith(o.rstrip("/") + "/") for o in dirs)]


def _same_table(a: RoutingTable, b: RoutingTable) -> bool:
    return a.to_dict() == b.to_dict()


def routed_variants(table: RoutingTable) -> list[str]:
    """The variants the routing table can send a request to (baseline first)."""
    names = table.variants()
    return sorted(names, key=lambda v: (v != BASELINE, v))


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def engine_builds(dirs: list[str]) -> tuple[list[str], list[str], list[int]]:
    """What the builds of the engine folders ``dirs`` recorded: the GPUs'
    compute capabilities (``trtspec.json``'s ``gpu``), the TensorRT-LLM
    versions (its ``versions``; both written by ``trtspec build``) and the
    ``gpus_per_node`` of their rank mapping (``config.json``, written by
    trtllm-build). Each list holds the distinct values found; a folder that
    did not record one adds nothing."""
    caps: set[str] = set()
    versions: set[str] = set()
    per_node: set[int] = set()
    for d in dirs:
        manifest = _read_json(Path(d) / ENGINE_MANIFEST)
        gpu = manifest.get("gpu")
        if isinstance(gpu, dict) and isinstance(gpu.get("compute_capability"), str):
            caps.add(gpu["compute_capability"])
        recorded = manifest.get("versions")
        if isinstance(recorded, dict):
            version = recorded.get("tensorrt_llm")
            if isinstance(version, str) and version and version != "absent":
                versions.add(version)
        config = _read_json(Path(d) / "config.json")
        mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
        if isinstance(mapping, dict) and isinstance(mapping.get("gpus_per_node"), int):
            per_node.add(int(mapping["gpus_per_node"]))
    return sorted(caps), sorted(versions), sorted(per_node)


def _tree_bytes(paths: list[str]) -> int:
    total = 0
    for p in paths:
        for f in Path(p).rglob("*"):
            if f.is_file():
                total += f.stat().st_size
    return total


def _root(repo: str, dirs: list[str], where: str) -> str:
    """The folder holding the repository and every engine: the volume's root."""
    root = os.path.commonpath([repo, *dirs])
    if root == "/":
        raise DeployError(
            f"{where}: the repository ({repo}) and its engines ({', '.join(dirs)}) share no "
            "folder but /, so no one volume can hold them",
            "build the engines and the repository under one folder (e.g. `trtspec build "
            "--engines /srv/trtspec/engines` and `trtspec repo` writing /srv/trtspec/triton_repo)",
        )
    return root


def _routing_needed(spec: Any, variants: list[str], given: bool, baseline_only: bool) -> None:
    others = [v for v in variants if v != BASELINE]
    if given or not others:
        return
    if not baseline_only:
        raise DeployError(
            f"spec {spec.name} has variants ({', '.join(others)}) but no routing table was "
            "given: the deployment would serve the baseline only",
            "pass the table the benchmark decided (--routing routing.yaml, or --repo of a "
            "repository built with `trtspec repo --routing`), or --baseline-only to deploy "
            "the baseline on purpose",
        )


def served_from(
    spec: Any,
    plan: Any,
    *,
    repo: Path | None,
    routing_file: Path | None,
    repo_root: Path = Path("triton_repo"),
    baseline_only: bool = False,
    table: RoutingTable | None = None,
) -> Served:
    """What one instance serves. ``repo``: the built repository (authoritative);
    ``routing_file``: a ``routing.yaml`` that must match the repository's router;
    ``table``: serve this table instead (one gateway pool's, ``trtspec.deploy.gateway``)."""
    default = float(spec.rollout.canary_percent)
    given = load_routing(routing_file, default_canary_percent=default) if routing_file else None
    if given is not None and baseline_only:
        raise DeployError(
            f"--baseline-only with --routing {routing_file}: the two disagree",
            "leave out one of them",
        )
    if repo is None:
        _routing_needed(spec, list(plan.variants), given is not None, baseline_only)
        table = table or given or routing_from_rollout(spec.rollout.fallback_variant)
        variants = routed_variants(table)
        unknown = [v for v in variants if v not in plan.variants]
        if unknown:
            raise DeployError(
                f"{routing_file or 'rollout'}: variant(s) {', '.join(unknown)} not in spec "
                f"{spec.name} (variants: {', '.join(plan.variants)})",
                "deploy the spec the routing table was measured with",
            )
        models, engines = _plan_models(plan, variants)
        where = str((repo_root / spec.name).absolute())
        dirs = [str(Path(e.dir).absolute()) for e in plan.engines if e.name in engines]
        caps, versions, per_node = engine_builds(dirs)
        return Served(
            repo=where,
            root=_root(where, dirs or [str(Path(plan.root).absolute())], f"spec {spec.name}"),
            models=models,
            engines=engines,
            variants=variants,
            routing=table,
            spec_hash=plan.spec_hash,
            repository_hash=None,
            engine_dirs=dirs,
            compute_capabilities=caps,
            trtllm_versions=versions,
            engine_gpus_per_node=per_node,
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
    if not routing_json.is_file():
        _routing_needed(spec, [str(v) for v in manifest.get("variants") or []],
                        given is not None, baseline_only)  # fmt: skip
    if given is not None and not routing_json.is_file():
        raise DeployError(
            f"{routing_file}: the repository's router serves no routing table "
            f"({routing_json} is missing)",
            f"install it first: trtspec repo {spec.source_path or 'SPEC'} --routing {routing_file}",
        )
    installed = (
        load_routing(routing_json, default_canary_percent=default)
        if routing_json.is_file()
        else routing_from_rollout(spec.rollout.fallback_variant)
    )
    if given is not None and not _same_table(given, installed):
        raise DeployError(
            f"{routing_file}: differs from the table the repository's router serves "
            f"({routing_json})",
            f"install it first: trtspec repo {spec.source_path or 'SPEC'} --routing {routing_file}",
        )
    table = table or installed
    variants = routed_variants(table)
    loaded: set[str] = {ROUTER}
    for v in variants:
        loaded.update(variant_models(repo, v))
    engines = engine_models(repo, loaded)
    engine_dirs = _engine_dirs(repo, sorted(loaded))
    caps, versions, per_node = engine_builds(engine_dirs)
    where = str(repo.absolute())
    return Served(
        repo=where,
        root=_root(where, engine_dirs, str(repo)),
        models=sorted(loaded),
        engines=engines,
        variants=variants,
        routing=table,
        spec_hash=str(manifest.get("spec_hash") or plan.spec_hash),
        repository_hash=repository_hash(repo),
        engine_dirs=engine_dirs,
        compute_capabilities=caps,
        trtllm_versions=versions,
        engine_gpus_per_node=per_node,
        data_bytes=_tree_bytes([where, *engine_dirs]),
    )
