"""``trtspec repo``: assemble the Triton model repository for a spec from its
built engines (``trtspec repo SPEC``), or validate any repository
(``trtspec repo --check DIR``). A thin wrapper over ``trtspec.repo``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from trtspec.cli._memory import gpu_memory_option, memory_for
from trtspec.cli._options import engines_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress
from trtspec.errors import RepoError


def _check(path: Path, fmt: str) -> None:
    from trtspec.repo.check import check_repository

    problems = check_repository(path)
    if problems:
        count = len(problems)
        head = f"{count} problem{'s' if count != 1 else ''} in repository {path}:"
        raise RepoError(
            head + "\n  " + "\n  ".join(str(p) for p in problems),
            "Fix each file named above, or regenerate the repository with `trtspec repo SPEC`.",
        )
    models = sorted(p.name for p in path.iterdir() if (p / "config.pbtxt").is_file())
    if fmt == "json":
        emit_json({"repository": str(path), "ok": True, "models": models, "problems": []})
    else:
        click.echo(f"OK: {path} ({len(models)} models)")


def _refuse_stale(
    table: Any,
    spec: Any,
    plan: Any,
    *,
    engines_root: Path,
    routing_file: Path,
    spec_path: Path,
    accept_stale: bool,
) -> None:
    """Nothing is written when the routing is stale: the repository (and its
    router) keep the table they have until a fresh one is installed."""
    from trtspec.fingerprint import stale_message, stale_routing

    if table.fingerprint is None:
        progress(
            f"Warning: {routing_file} carries no fingerprint (not written by "
            "`trtspec bench`?), so it cannot be checked for staleness"
        )
        return
    found = stale_routing(table, spec, plan, engines_root)
    if not found:
        return
    message, hint = stale_message(routing_file, spec_path, found)
    if not accept_stale:
        raise RepoError(message, hint)
    progress("Warning: --accept-stale: installing " + message.split(": ", 1)[1])


@click.command("repo")
@click.argument("path", type=click.Path(path_type=Path))
@click.option(
    "--check",
    "check_only",
    is_flag=True,
    help="Validate the repository at PATH instead of building one from a spec.",
)
@engines_option("Engines root; the spec's engines are in ENGINES/<spec>/.")
@click.option(
    "--output",
    "output",
    type=click.Path(path_type=Path),
    default=Path("triton_repo"),
    show_default=True,
    help="Where to write the repository (OUTPUT/<spec>/).",
)
@click.option(
    "--routing",
    "routing_file",
    type=click.Path(path_type=Path),
    default=None,
    help="routing.yaml from `trtspec bench`; default: the spec's rollout.",
)
@click.option(
    "--accept-stale",
    is_flag=True,
    help="Install a routing file even when what it measured has changed since.",
)
@gpu_memory_option
@format_option
def repo(
    *,
    path: Path,
    check_only: bool,
    engines_root: Path,
    output: Path,
    routing_file: Path | None,
    accept_stale: bool,
    gpu_bytes: int | None,
    fmt: str,
) -> None:
    """Build the Triton model repository for the spec at PATH (engines/ →
    triton_repo/), or with --check validate the repository folder at PATH."""
    if check_only:
        _check(path, fmt)
        return
    if path.is_dir():
        raise click.UsageError(
            f"{path} is a folder; pass a spec file, or add --check to validate a repository"
        )
    from trtspec.artifacts.routing import load_routing
    from trtspec.flows import flow_for, load_plan
    from trtspec.repo.check import check_repository
    from trtspec.spec import load_spec

    spec = load_spec(path)
    plan = load_plan(spec, engines_root, spec_path=path)
    table = None
    if routing_file is not None:
        table = load_routing(
            routing_file, default_canary_percent=float(spec.rollout.canary_percent)
        )
        _refuse_stale(
            table,
            spec,
            plan,
            engines_root=engines_root,
            routing_file=routing_file,
            spec_path=path,
            accept_stale=accept_stale,
        )
    progress(f"Assembling {output / spec.name} from {engines_root / spec.name} …")
    memory = memory_for(spec, plan, gpu_bytes)  # planned once: its warnings, then the KV sizes
    from trtspec.rollout.golden import golden_set

    # the router's golden diff mirrors these (rendered as the bench renders them)
    golden = golden_set(spec, spec.tokenizer_dir(engines_root))
    result = flow_for(spec).assemble(
        spec, plan, engines_root, output, routing=table, memory=memory, golden=golden
    )
    problems = check_repository(result)
    if problems:
        raise RepoError(
            f"the assembled repository {result} fails its own check:\n  "
            + "\n  ".join(str(p) for p in problems),
            "This is a trtspec bug; please report it with the spec.",
        )
    manifest_models = sorted(p.name for p in result.iterdir() if (p / "config.pbtxt").is_file())
    if fmt == "json":
        emit_json({"repository": str(result), "models": manifest_models})
    else:
        emit_table(
            ["model", "config"], [[m, str(result / m / "config.pbtxt")] for m in manifest_models]
        )


COMMANDS: list[click.Command] = [repo]
