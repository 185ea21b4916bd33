"""Cache-state parity between the arms of a benchmark (docs/design/decisions.md).

``--prefix-cache cold`` (the default): no arm's request may find KV blocks
another arm left for the same prompt. Arms that call the same engine model
with block reuse on (``ngram`` and ``draft_*`` both verify on ``target_dte``;
the k values of one variant share everything) would otherwise do exactly that
in ABBA order. The Triton ``tensorrtllm`` backend offers no per-request cache
salt (``createRequestsFromInputTensors`` builds the executor ``Request``
without a ``cacheSaltID``) and no eviction call, so the benchmark serves a
*parity copy* of the repository instead: every arm after the first on a shared
engine model gets its own copy of that engine model (same engine folder, same
weights, its own KV pool) and of its orchestrator. The copies are small
config folders; the price is one more engine instance in memory per extra arm
(on a GPU the KV-cache fraction is split evenly over all engine models).

Why not a per-request cache salt instead of the copy (issue 24 item 3, read
in NVIDIA/TensorRT-LLM): the salt exists below Triton only. The executor's
``Request`` takes a ``cacheSaltID`` and the block manager mixes it into the
hash of a sequence's first block, so blocks are reused only between requests
with the same salt (``buildBlockKeys`` / ``BlockKeyHasher::hash`` in
``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp`` at b35ac1b6, 1.2.0rc2);
the LLM API passes ``generate_async(..., cache_salt=...)`` down to it
(``tensorrt_llm/llmapi/llm.py`` at 4c05a748) and ``trtllm-serve`` reads an
OpenAI request's ``cache_salt``. Neither Triton model trtspec serves passes
one: the ``tensorrtllm`` backend (above) and the LLM-API flow's ``llmapi``
model, whose ``_execute_single_request`` calls ``generate_async(prompt,
SamplingParams(**sampling_params), streaming)``, no salt (a salt is a
``generate_async`` argument, not a sampling parameter)
(``triton_backend/all_models/llmapi/tensorrt_llm/1/model.py`` at b35ac1b6
and 044a90d2). The reference engine model stands in for those models, so it
takes no salt either (only the engine model differs between the GPU and the
CPU, and it may not accept what its GPU counterpart refuses): every flow
keeps the copy.

``--prefix-cache warm``: every measured request is preceded, on the same
stream, by a 1-token request for the same prompt through the same arm, so
each arm's engines hold the prompt when the measured request arrives.

``--prefix-cache off``: the repository as served; kept to show the asymmetry.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from trtspec.artifacts.repo_manifest import MANIFEST_NAME as MANIFEST
from trtspec.bench.client import Arm
from trtspec.errors import BenchError

COLD, WARM, OFF = "cold", "warm", "off"
POLICIES = (COLD, WARM, OFF)
FRACTION = "kv_cache_free_gpu_mem_fraction"


def _manifest(repo: Path) -> dict[str, Any]:
    path = repo / MANIFEST
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise BenchError(
            f"{path}: cannot read the repository manifest ({exc})",
            hint="rebuild the repository with `trtspec repo SPEC`",
        ) from None


def _reuses(repo: Path, model: str) -> bool:
    from trtspec.repo.configs import parameters_of, read_config

    params = parameters_of(read_config(repo / model / "config.pbtxt"))
    return params.get("enable_kv_cache_reuse", "true").strip().lower() in ("1", "true", "yes")


def shared_engines(repo: Path, arms: list[Arm]) -> dict[str, list[str]]:
    """Engine models with block reuse that more than one arm calls: name →
    arm labels, in arm order."""
    models = _manifest(repo).get("models") or {}
    users: dict[str, list[str]] = {}
    for arm in arms:
        for callee in (models.get(arm.model) or {}).get("calls") or []:
            if (models.get(callee) or {}).get("role") == "engine" and _reuses(repo, callee):
                users.setdefault(callee, []).append(arm.label)
    return {e: labels for e, labels in users.items() if len(labels) > 1}


def _copy_model(
    repo: Path, dest: Path, old: str, new: str, rename: dict[str, str] | None = None
) -> None:
    from trtspec.repo.configs import read_config, set_parameters, write_config

    shutil.copytree(repo / old, dest / new)
    config = read_config(dest / new / "config.pbtxt")
    config.name = new
    if rename:
        set_parameters(
            config,
            {
                key: rename[value.string_value]
                for key, value in config.parameters.items()
                if value.string_value in rename
            },
        )
    write_config(dest / new / "config.pbtxt", config)


def parity_repo(repo: Path, arms: list[Arm], dest: Path) -> list[Arm]:
    """Write to ``dest`` a copy of ``repo`` in which no two arms share an
    engine model with block reuse; returns the arms pointed at their own
    orchestrators (unchanged when nothing is shared: then ``dest`` is a
    plain copy)."""
    from trtspec.repo.configs import read_config, set_parameters, write_config

    shared = shared_engines(repo, arms)
    manifest = _manifest(repo)
    models: dict[str, Any] = manifest.setdefault("models", {})
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(repo, dest, symlinks=True)
    taken: set[str] = set()
    out: list[Arm] = []
    for index, arm in enumerate(arms):
        calls = list((models.get(arm.model) or {}).get("calls") or [])
        mine = [e for e in calls if e in shared]
        if not mine or not taken.intersection(mine):
            taken.update(mine)
            out.append(arm)
            continue
        suffix = f"__arm{index}"
        rename = {e: e + suffix for e in mine}
        for old, new in rename.items():
            _copy_model(repo, dest, old, new)
            models[new] = {**models[old]}
        orchestrator = arm.model + suffix
        _copy_model(repo, dest, arm.model, orchestrator, rename)
        models[orchestrator] = {**models[arm.model], "calls": [rename.get(c, c) for c in calls]}
        taken.update(rename.values())
        out.append(dataclasses.replace(arm, model=orchestrator))
    copies = [n for n in models if "__arm" in n and models[n].get("role") == "engine"]
    fractions: dict[str, tuple[Any, float]] = {}
    for name, info in models.items():
        if info.get("role") != "engine":
            continue
        config = read_config(dest / name / "config.pbtxt")
        if FRACTION in config.parameters:
            fractions[name] = (config, float(config.parameters[FRACTION].string_value))
    if copies and fractions:
        # Every engine model takes an equal slice of what the originals took.
        originals = sum(f for n, (_, f) in fractions.items() if n not in copies)
        share = round(originals / len(fractions), 4)
        for name, (config, _) in fractions.items():
            set_parameters(config, {FRACTION: share})
            write_config(dest / name / "config.pbtxt", config)
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return out
