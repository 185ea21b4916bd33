"""``engines/<spec>/plan.json``: the build plan, written by ``trtspec build``
and read by every later stage instead of making the plan again.

The plan (``trtspec.plan.Plan``: engines, variants, steps) is a function of
the spec's build inputs — name, stack, backend, flow, target, dtype and
variants; routes, bench, rollout and router settings do not feed it — and of
the engines root. ``save_plan`` writes the plan with a digest of those inputs
(atomic replace); ``load_plan`` reads it back for the spec a later stage was
given and refuses, naming the fix, a missing file, another schema version, or
a plan whose build inputs differ from the spec's (the spec changed since
``trtspec build``: its engines would not be the ones it describes). The
engines root recorded at build time is rebased onto the one the later stage
is given, so ``load_plan(spec, root)`` equals what ``make_plan(spec, root)``
returned when the engines were built (``trtspec.flows.load_plan`` turns the
data into the ``Plan``; ``trtspec.flows.stage_plan`` is the reader for a stage
that may also run before any build).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import ArtifactError
from trtspec.fsutil import atomic_write_json

if TYPE_CHECKING:
    from trtspec.plan import Plan
    from trtspec.spec import Spec

# Imports nothing of the build side (the router's artifacts share this
# package, and the plan's own module imports the modes): the plan's
# dataclasses are encoded field by field, and decoded by trtspec.plan.

PLAN_FILE = "plan.json"
SCHEMA_VERSION = 1
# spec sections the plan never reads (trtspec.plan, trtspec.flows, trtspec.modes)
NOT_BUILD_INPUTS = ("routes", "bench", "rollout", "router")


def plan_path(spec_name: str, engines_root: Path) -> Path:
    return Path(engines_root) / spec_name / PLAN_FILE


def build_inputs(spec: Spec) -> str:
    """The digest of what the spec's plan is made from."""
    data = {k: v for k, v in spec.canonical().items() if k not in NOT_BUILD_INPUTS}
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def save_plan(spec: Spec, plan: Plan) -> Path:
    """Write ``plan`` (made for ``spec``) to ``<plan.root>/plan.json``."""
    path = Path(plan.root) / PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        path,
        {
            "schema_version": SCHEMA_VERSION,
            "spec": spec.name,
            "build_inputs": build_inputs(spec),
            "root": str(plan.root),
            "plan": _plain(plan),
        },
    )
    return path


def _rebase(value: Any, old: str, new: str) -> Any:
    """Every path under ``old`` (whole, as a prefix, or after ``=``) moved under ``new``."""
    if old == new:
        return value
    if isinstance(value, str):
        return re.sub(r"(^|=)" + re.escape(old) + r"(?=/|$)", lambda m: m.group(1) + new, value)
    if isinstance(value, list):
        return [_rebase(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: _rebase(v, old, new) for k, v in value.items()}
    return value


def read_plan(
    spec: Spec, engines_root: Path, *, spec_path: str | Path | None = None
) -> dict[str, Any]:
    """The plan ``trtspec build`` wrote for ``spec`` under ``engines_root``, as
    data rebased onto ``engines_root`` (``trtspec.plan.plan_from_dict`` makes
    the ``Plan``; ``trtspec.flows.load_plan`` does both)."""
    path = plan_path(spec.name, engines_root)
    shown = spec_path or spec.name
    rebuild = f"run `trtspec build {shown}` (cached steps are skipped; it writes {PLAN_FILE})"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ArtifactError(
            f"{path}: no build plan: the engines of spec {spec.name} were not built here",
            f"{rebuild}, or pass --engines DIR with the folder they were built in",
        ) from None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise ArtifactError(f"{path}: not a build plan ({exc})", rebuild) from None
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ArtifactError(
            f"{path}: schema_version: {version!r} is not supported "
            f"(this trtspec reads {SCHEMA_VERSION})",
            rebuild,
        )
    if doc.get("spec") != spec.name:
        raise ArtifactError(
            f"{path}: spec: written for spec {doc.get('spec')!r}, not {spec.name!r}", rebuild
        )
    if doc.get("build_inputs") != build_inputs(spec):
        raise ArtifactError(
            f"{path}: build_inputs: {shown} changed since `trtspec build` wrote this plan "
            "(its stack, backend, flow, target or variants): the engines are not the ones "
            "the spec describes",
            f"{rebuild.replace('cached steps are skipped', 'changed engines are rebuilt')}",
        )
    plan = doc.get("plan")
    if not isinstance(plan, dict) or not isinstance(doc.get("root"), str):
        raise ArtifactError(f"{path}: plan: missing or malformed", rebuild)
    rebased: dict[str, Any] = _rebase(plan, doc["root"], str(Path(engines_root) / spec.name))
    return rebased
