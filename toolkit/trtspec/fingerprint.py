"""Fingerprints: the identity of what a benchmark measured, and what changed
since. ``measure`` records, at bench time, each engine folder's identity (from
its ``trtspec.json`` manifest: build-step cache keys — which cover the input
weights' identity, the build argv and tool versions — plus the argv and
versions themselves, so a change can be explained), the target tokenizer and
its chat template (hashed apart, so a template edit is named as such), each
route's prompt-file hash and sampling settings, each variant's spec settings
and engines, the serving repository's hash and the TensorRT-LLM / Triton
versions. ``current`` computes the same identity from a spec and its engines
now; ``changes`` compares the two and says, in the user's words, what differs
and which routes × variants must be re-measured. Pure library code: no Click,
no subprocesses; reading files only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.artifacts.engine_manifest import MANIFEST
from trtspec.artifacts.repo_manifest import ROUTING_FILE
from trtspec.catalogue import BASELINE
from trtspec.vocab import gpu_backend

FINGERPRINT_SCHEMA_VERSION = 1
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
# sampling keys whose change makes a measurement stale; the seed only picks
# which random draws a sampled run makes, so it is recorded but not compared
SAMPLING_KEYS = ("temperatures", "top_p", "top_k", "max_tokens")
_HASH_CHARS = 16
LARGE_FILE_BYTES = 64 * 2**20
TOKENIZER_ONLY = "tokenizer files changed"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:_HASH_CHARS]


def _sha_json(obj: Any) -> str:
    return _sha(json.dumps(obj, sort_keys=True, default=str).encode("utf-8"))


def file_hash(path: Path) -> str | None:
    """Content hash of a file, ``None`` when it cannot be read."""
    try:
        return _sha(Path(path).read_bytes())
    except OSError:
        return None


def tree_hash(folder: Path, *, skip: Iterable[str] = ()) -> str | None:
    """Content hash of every file under ``folder`` (relative names included),
    leaving out the relative paths in ``skip`` (a file, or a folder and all
    under it); ``None`` when it is no folder.
    Files over ``LARGE_FILE_BYTES`` count by size and first MiB."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    skipped = set(skip)
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel in skipped or "__pycache__" in path.parts:
            continue
        if any(rel.startswith(f"{name}/") for name in skipped):  # a skipped folder
            continue
        h.update(rel.encode() + b"\0")
        try:
            size = path.stat().st_size
            if size > LARGE_FILE_BYTES:
                # engine files inside a repository can be tens of GB: size and head only
                with open(path, "rb") as fh:
                    h.update(f"{size}:".encode() + hashlib.sha256(fh.read(2**20)).digest())
            else:
                h.update(hashlib.sha256(path.read_bytes()).digest())
        except OSError:
            h.update(b"<unreadable>")
    return h.hexdigest()[:_HASH_CHARS]


def prompts_path(spec: Any, prompts: str) -> Path:
    """A route's prompt file: absolute, or relative to the spec's folder."""
    path = Path(prompts)
    source = getattr(spec, "source_path", None)
    base = Path(source).parent if source else Path.cwd()
    return path if path.is_absolute() else (base / path).resolve()


# -- parts ---------------------------------------------------------------------------------


def engine_identity(folder: Path) -> dict[str, Any]:
    """What an engine folder is: ``id`` changes whenever anything it was built
    from changes; ``steps``/``argv``/``versions`` say which part did."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if isinstance(manifest, dict) and isinstance(manifest.get("steps"), list):
        steps = [s for s in manifest["steps"] if isinstance(s, dict)]
        keys = [s.get("cache_key") for s in steps]
        raw = manifest.get("versions")
        versions: dict[str, Any] = raw if isinstance(raw, dict) else {}
        out: dict[str, Any] = {
            "built_at": manifest.get("built_at"),
            "steps": _sha_json(keys),
            "argv": _sha_json([s.get("argv") for s in steps]),
            "versions": {str(k): v for k, v in sorted(versions.items())},
        }
        out["id"] = _sha_json([out["steps"], out["argv"], out["versions"]])
        # the build's file records (trtspec.integrity), split so that a
        # rebuild can be explained: tokenizer files vs the rest (weights, config)
        files = manifest.get("files")
        if isinstance(files, dict):
            tok = {k: v for k, v in files.items() if k.startswith("tokenizer/")}
            rest = {
                k: v
                for k, v in files.items()
                if not k.startswith("tokenizer/") and k != "build.log"
            }
            out["tokenizer_files"], out["weight_files"] = _sha_json(tok), _sha_json(rest)
        return out
    if (folder / "config.json").is_file():
        # not built by trtspec: the files themselves are the identity
        files = tree_hash(folder, skip=("tokenizer",))
        return {"built_at": None, "files": files, "id": files}
    return {"built_at": None, "missing": True, "id": None}


def tokenizer_identity(folder: Path | None) -> dict[str, Any]:
    """The tokenizer's hash without its chat template, and the template's own
    hash (from ``tokenizer_config.json`` or a ``chat_template.*`` file)."""
    if folder is None or not Path(folder).is_dir():
        return {"tokenizer": None, "chat_template": None}
    folder = Path(folder)
    template: Any = None
    config_hash = None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if isinstance(config, dict):
        template = config.pop("chat_template", None)
        config_hash = _sha_json(config)
    for name in CHAT_TEMPLATE_FILES:
        if template is None and (folder / name).is_file():
            template = (folder / name).read_text(encoding="utf-8", errors="replace")
    rest = tree_hash(folder, skip=("tokenizer_config.json", *CHAT_TEMPLATE_FILES))
    return {
        "tokenizer": _sha_json([rest, config_hash]),
        "chat_template": None if template is None else _sha_json(template),
    }


def route_identity(path: Path, sampling: dict[str, Any]) -> dict[str, Any]:
    return {"prompts": file_hash(path), "sampling": dict(sampling)}


def repository_hash(repo: Path | None) -> str | None:
    """The serving repository without its routing table (installing a new
    table must not make the measurement it came from stale) and without the
    rollout folder the router writes its state and logs to while serving."""
    if repo is None:
        return None
    return tree_hash(Path(repo), skip=(f"router/{ROUTING_FILE}", "router/rollout"))


def _variant_settings(spec: Any) -> dict[str, str]:
    out = {BASELINE: _sha_json(spec.target.model_dump(mode="json"))}
    for v in spec.variants:
        out[str(v.name)] = _sha_json(v.model_dump(mode="json"))
    return out


def _trtllm_version(spec: Any, engines: dict[str, Any]) -> str | None:
    if gpu_backend(spec.backend):
        return str(spec.stack.trtllm_version)
    return None


def _build(
    spec: Any,
    plan: Any,
    *,
    routes: dict[str, dict[str, Any]],
    tokenizer_dir: Path | None,
    repository: Path | None,
) -> dict[str, Any]:
    engines = {e.name: {"role": e.role, **engine_identity(Path(e.dir))} for e in plan.engines}
    settings = _variant_settings(spec)
    variants = {}
    for name, ve in plan.variants.items():
        names = [ve.target] + ([ve.draft] if ve.draft else [])
        variants[name] = {"engines": names, "settings": settings.get(name)}
    return {
        "schema_version": FINGERPRINT_SCHEMA_VERSION,
        "spec_hash": getattr(spec, "spec_hash", None),
        "target": tokenizer_identity(tokenizer_dir),
        "engines": engines,
        "variants": variants,
        "routes": routes,
        "repository": repository_hash(repository),
        "versions": {"tensorrt_llm": _trtllm_version(spec, engines), "tritonserver": None},
    }


def measure(
    spec: Any,
    engines_root: Path,
    *,
    routes: dict[str, tuple[Path, int]],
    sampling: dict[str, Any],
    tokenizer_dir: Path | None,
    repository: Path | None,
    route_temperatures: dict[str, list[float]] | None = None,
) -> dict[str, Any]:
    """The fingerprint of a bench run: ``routes`` maps a route to its prompt
    file and ``max_tokens``; ``sampling`` holds the run's temperatures,
    top_p, top_k and seed; ``route_temperatures`` those of a route measured
    at its own (routes.<name>.temperatures)."""
    from trtspec.flows import stage_plan

    plan = stage_plan(spec, Path(engines_root))
    own = route_temperatures or {}
    route_ids = {
        name: route_identity(
            path, {**sampling, **_temps(own.get(name)), "max_tokens": int(max_tokens)}
        )
        for name, (path, max_tokens) in routes.items()
    }
    return _build(spec, plan, routes=route_ids, tokenizer_dir=tokenizer_dir, repository=repository)


def current(spec: Any, plan: Any, *, tokenizer_dir: Path | None) -> dict[str, Any]:
    """The fingerprint the spec and its engines have now (the sampling the
    spec's ``bench`` section asks for)."""
    bench = spec.bench
    sampling = {
        "temperatures": [float(t) for t in bench.temperatures],
        "top_p": bench.top_p,
        "top_k": bench.top_k,
        "seed": bench.seed,
    }
    routes = {
        name: route_identity(
            prompts_path(spec, r.prompts),
            {**sampling, **_temps(r.temperatures), "max_tokens": r.max_tokens},
        )
        for name, r in spec.routes.items()
    }
    return _build(spec, plan, routes=routes, tokenizer_dir=tokenizer_dir, repository=None)


def _temps(own: list[float] | None) -> dict[str, Any]:
    """A route's own temperatures over the run's, when it has them."""
    return {} if own is None else {"temperatures": [float(t) for t in own]}


# -- comparing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Change:
    """One difference; ``routes``/``variants`` are the cells to re-measure
    (``None`` = all of them)."""

    text: str
    routes: frozenset[str] | None = None
    variants: frozenset[str] | None = None


def _engine_reason(old: dict[str, Any], new: dict[str, Any]) -> str:
    if new.get("missing"):
        return "not built"
    if "files" in old or "files" in new:
        return "engine files changed"
    reasons = []
    if old.get("argv") != new.get("argv"):
        reasons.append("build argv changed")
    ov, nv = old.get("versions") or {}, new.get("versions") or {}
    moved = [
        f"{k} {ov.get(k)} → {nv.get(k)}"
        for k in sorted(set(ov) | set(nv))
        if ov.get(k) != nv.get(k)
    ]
    if moved:
        reasons.append("tool versions changed: " + ", ".join(moved))
    if not reasons:
        # the cache keys hash argv, versions and the inputs' identity: with
        # argv and versions equal, the inputs (the model folder) are what moved
        tok = old.get("tokenizer_files") != new.get("tokenizer_files")
        weights = old.get("weight_files") != new.get("weight_files")
        reasons.append(
            TOKENIZER_ONLY
            if tok and not weights
            else "weights and tokenizer files changed"
            if tok
            else "weights changed"
        )
    return ", ".join(reasons)


def _when(engine: dict[str, Any]) -> str:
    built = engine.get("built_at")
    return f"rebuilt {str(built)[:10]}" if built else "changed"


def _fmt(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return format(value, "g") if isinstance(value, float) else str(value)


def _sampling_change(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    out = []
    for key in SAMPLING_KEYS:
        a, b = old.get(key), new.get(key)
        # measured at every temperature the spec asks for: still valid
        if key == "temperatures" and a is not None and b is not None and set(b) <= set(a):
            continue
        if a != b:
            out.append(f"{key} {_fmt(a)} → {_fmt(b)}")
    return out


def changes(
    recorded: dict[str, Any], now: dict[str, Any], *, routes: Iterable[str] | None = None
) -> list[Change]:
    """What differs between a recorded fingerprint and ``now``, limited to
    ``routes`` (default: every recorded route) and the recorded variants."""
    out: list[Change] = []
    old_t, new_t = recorded.get("target") or {}, now.get("target") or {}
    if old_t.get("tokenizer") is not None:  # else the run had no tokenizer folder to hash
        if old_t["tokenizer"] != new_t.get("tokenizer"):
            out.append(Change("target tokenizer changed"))
        if old_t.get("chat_template") != new_t.get("chat_template"):
            out.append(Change("target chat template changed"))
    said_tokenizer = bool(out)
    old_e, new_e = recorded.get("engines") or {}, now.get("engines") or {}
    new_v = now.get("variants") or {}
    for variant, info in (recorded.get("variants") or {}).items():
        scope = None if variant == BASELINE else frozenset({variant})
        if variant not in new_v:
            out.append(Change(f"variant {variant}: no longer in the spec", variants=scope))
            continue
        if info.get("settings") != new_v[variant].get("settings"):
            what = "target" if variant == BASELINE else "variant"
            out.append(
                Change(f"variant {variant}: {what} settings in the spec changed", variants=scope)
            )
        for engine in info.get("engines") or []:
            old, new = old_e.get(engine) or {}, new_e.get(engine) or {"missing": True}
            if old.get("id") is None or (old["id"] == new.get("id") and not new.get("missing")):
                continue  # unchanged, or nothing was recorded (bench of a remote endpoint)
            role = new.get("role") or old.get("role") or "engine"
            reason = "" if new.get("missing") else _engine_reason(old, new)
            if reason == TOKENIZER_ONLY and said_tokenizer:
                continue  # the engine only carries the target tokenizer change named above
            text = (
                f"variant {variant}: {role} engine {engine} not built"
                if new.get("missing")
                else f"variant {variant}: {role} engine {engine} {_when(new)} ({reason})"
            )
            out.append(Change(text, variants=scope))
    old_r, new_r = recorded.get("routes") or {}, now.get("routes") or {}
    for route in list(routes) if routes is not None else list(old_r):
        if route not in old_r:
            continue
        only = frozenset({route})
        if route not in new_r:
            out.append(Change(f"route {route}: no longer in the spec", routes=only))
            continue
        if old_r[route].get("prompts") != new_r[route].get("prompts"):
            out.append(Change(f"route {route}: prompts changed", routes=only))
        moved = _sampling_change(
            old_r[route].get("sampling") or {}, new_r[route].get("sampling") or {}
        )
        if moved:
            out.append(Change(f"route {route}: sampling changed ({'; '.join(moved)})", routes=only))
    return out


def remeasure_command(spec_path: str, found: list[Change]) -> str:
    """``trtspec bench SPEC`` narrowed to the cells ``found`` touches."""
    route_sets = [c.routes for c in found]
    variant_sets = [c.variants for c in found]
    argv = ["trtspec", "bench", spec_path]
    if route_sets and all(r is not None for r in route_sets):
        argv += ["--routes", ",".join(sorted(set().union(*[r for r in route_sets if r])))]
    if variant_sets and all(v is not None for v in variant_sets):
        argv += ["--variants", ",".join(sorted(set().union(*[v for v in variant_sets if v])))]
    return " ".join(argv)


def diff(a: dict[str, Any] | None, b: dict[str, Any] | None) -> list[str]:
    """Every leaf that differs between two fingerprints, as ``path: A → B``
    lines (for ``trtspec compare``)."""
    out: list[str] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y), key=str):
                walk(x.get(key), y.get(key), f"{path}.{key}" if path else str(key))
        elif x != y:
            out.append(f"{path}: {_fmt(x)} → {_fmt(y)}")

    walk(a or {}, b or {}, "")
    return out


def stale_routing(table: Any, spec: Any, plan: Any, engines_root: Path) -> list[Change]:
    """What changed since ``table`` (a ``RoutingTable`` from ``routing.yaml``)
    was measured, for its routes; ``[]`` when nothing did or when the table
    carries no fingerprint (a hand-written table: see ``unverifiable``)."""
    recorded = getattr(table, "fingerprint", None)
    if not recorded:
        return []
    now = current(spec, plan, tokenizer_dir=spec.tokenizer_dir(engines_root))
    return changes(recorded, now, routes=list(table.routes) or None)


def stale_message(routing_file: Path, spec_path: Path, found: list[Change]) -> tuple[str, str]:
    """The error and hint ``trtspec repo --routing`` gives for stale routing."""
    head = (
        f"{routing_file}: stale routing: {len(found)} thing"
        f"{'s' if len(found) != 1 else ''} changed since it was measured:\n  "
    )
    hint = (
        f"re-measure just those cells with `{remeasure_command(str(spec_path), found)}` "
        "and install that run's routing.yaml (compare the two runs with `trtspec compare`), "
        "or pass --accept-stale to install this one anyway; the repository keeps its "
        "current routing table until then."
    )
    return head + "\n  ".join(c.text for c in found), hint
