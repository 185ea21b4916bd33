"""``trtspec validate``, ``trtspec build`` and ``trtspec inspect``: thin Click
wrappers over ``trtspec.spec``, ``trtspec.plan`` and ``trtspec.build``. Data
goes to stdout (``--format table|json``); warnings and progress go to stderr."""

from __future__ import annotations

import difflib
import os
import shlex
from pathlib import Path
from typing import Any

import click

from trtspec.cli._memory import gpu_memory_option, memory_for, memory_table
from trtspec.cli._options import engines_option, examples_dir_option
from trtspec.cli._output import emit_json, emit_table, format_option, progress


def _warn(messages: list[str]) -> None:
    for m in messages:
        click.echo(f"Warning: {m}", err=True)


def _load(spec_path: str) -> Any:
    from trtspec.spec import load_spec

    spec = load_spec(spec_path)
    _warn(spec.warnings)
    return spec


@click.command("validate")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@gpu_memory_option
@format_option
def validate_cmd(spec_path: str, gpu_bytes: int | None, fmt: str) -> None:
    """Check a build spec without building anything; print its variants, engines
    and (GPU specs) the memory plan."""
    from trtspec.flows import make_plan

    spec = _load(spec_path)
    plan = make_plan(spec)
    memory = memory_for(spec, plan, gpu_bytes)
    # the LLM-API flow pins its own TensorRT-LLM version (flow.trtllm_version)
    version = getattr(spec.flow, "trtllm_version", spec.stack.trtllm_version)
    rows = []
    built = {e.name for e in plan.engines}
    for name, ve in plan.variants.items():
        # an LLM-API variant on a GPU has no engine: its LLM model is named instead
        draft_len = plan.engine(ve.target).max_draft_len if ve.target in built else "-"
        rows.append(
            [
                name,
                ve.mode,
                draft_len if ve.mode != "none" else "-",
                ve.target,
                ve.draft or "-",
            ]
        )
    if fmt == "json":
        emit_json(
            {
                "valid": True,
                "spec": spec.name,
                "spec_hash": spec.spec_hash,
                "backend": spec.backend.value,
                "flow": spec.flow.kind,
                "trtllm_version": version,
                "warnings": spec.warnings,
                "variants": [
                    dict(zip(("name", "mode", "max_draft_len", "target", "draft"), r, strict=True))
                    for r in rows
                ],
                "engines": [e.to_dict() for e in plan.engines],
                "memory": None if memory is None else memory.to_dict(),
            }
        )
        return
    flow = "" if spec.flow.implicit else f"flow {spec.flow.kind}, "
    click.echo(
        f"{spec_path}: valid ({spec.name}, backend {spec.backend.value}, "
        f"{flow}TensorRT-LLM {version})"
    )
    emit_table(["variant", "mode", "max_draft_len", "target engine", "draft engine"], rows)
    if memory is not None:
        click.echo(memory_table(memory))


def _check_only(plan: Any, only: str | None) -> None:
    if only is not None and only not in plan.variants:
        close = difflib.get_close_matches(only, list(plan.variants), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise click.BadParameter(
            f"no variant named {only!r} (variants: {', '.join(plan.variants)}).{hint}",
            param_hint="'--only'",
        )


@click.command("build")
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@click.option("--dry-run", is_flag=True, help="Print every step (argv, cache state) and run none.")
@click.option("--force", is_flag=True, help="Rebuild even when a step's cache key is unchanged.")
@click.option("--only", metavar="VARIANT", help="Build only the engines this variant needs.")
@engines_option("Engines root; the spec's engines go to ENGINES/<spec>/.", "--engines-dir")
@examples_dir_option
@click.option("--verbose", "-v", is_flag=True, help="Echo each step's output on stderr.")
@gpu_memory_option
@format_option
def build_cmd(
    *,
    spec_path: str,
    dry_run: bool,
    force: bool,
    only: str | None,
    engines_root: Path,
    examples_dir: str | None,
    verbose: bool,
    gpu_bytes: int | None,
    fmt: str,
) -> None:
    """Build the engines of a spec (steps whose inputs are unchanged are skipped)."""
    from trtspec.build.executor import backend_for, execute, plan_status, run_subprocess
    from trtspec.flows import flow_for, make_plan

    spec = _load(spec_path)
    flow = flow_for(spec)
    plan = make_plan(spec, engines_root, examples_dir=examples_dir)
    _check_only(plan, only)
    memory = memory_for(spec, plan, gpu_bytes)
    # files the flow writes beside the engines, checked before any step runs
    files = flow.files(spec, plan, engines_root, memory=memory)
    if dry_run:
        status = plan_status(plan, force=force, only=only)
        if fmt == "json":
            data = plan.to_dict()
            data["steps"] = [{**s.to_dict(), "cached": cached} for s, cached in status]
            data["memory"] = None if memory is None else memory.to_dict()
            data["files"] = {str(p): text for p, text in files.items()}
            emit_json(data)
            return
        rows = [
            [
                i + 1,
                os.path.relpath(s.unit, plan.root),
                s.kind,
                "cached" if c else "run",
                shlex.join(s.argv),
            ]
            for i, (s, c) in enumerate(status)
        ]
        rows += [
            [len(rows) + i + 1, os.path.relpath(p, plan.root), "file", "write", str(p)]
            for i, p in enumerate(files)
        ]
        emit_table(["#", "unit", "kind", "state", "command"], rows)
        if memory is not None:
            click.echo(memory_table(memory))
        return

    def runner(argv: Any, cwd: Any, env: Any, log: Path) -> None:
        run_subprocess(
            argv, cwd, env, log, echo=(lambda line: click.echo(line, err=True)) if verbose else None
        )

    result = execute(
        plan,
        backend=backend_for(plan.backend),
        force=force,
        only=only,
        runner=runner,
        progress=progress,
    )
    written = flow.write_files(files)
    from trtspec.artifacts.plan import save_plan

    save_plan(spec, plan)  # what the later stages read instead of planning again
    selected = {o.step.unit for o in result.outcomes}
    ran = {o.step.unit for o in result.outcomes if o.status == "ran"}
    engines = [e for e in plan.engines if str(e.dir) in selected]
    if fmt == "json":
        emit_json(
            {
                "spec": spec.name,
                "spec_hash": spec.spec_hash,
                "engines": [
                    {**e.to_dict(), "state": "built" if str(e.dir) in ran else "cached"}
                    for e in engines
                ],
                "steps": [
                    {"id": o.step.id, "status": o.status, "seconds": round(o.seconds, 3)}
                    for o in result.outcomes
                ],
                "files": [str(p) for p in written],
            }
        )
        return
    emit_table(
        ["engine", "mode", "max_draft_len", "state", "folder"],
        [
            [
                e.name,
                e.mode,
                e.max_draft_len,
                "built" if str(e.dir) in ran else "cached",
                str(e.dir),
            ]
            for e in engines
        ]
        + [[p.stem, "llm-args", "-", "written", str(p)] for p in written],
    )


@click.command("inspect")
@click.argument("engine_dir", metavar="ENGINE_DIR", type=click.Path(path_type=Path))
@format_option
def inspect_cmd(engine_dir: Path, fmt: str) -> None:
    """Show what an engine folder holds (TRT-LLM config.json and trtspec manifest)."""
    from trtspec.build.inspect import read_engine

    info = read_engine(engine_dir)
    if fmt == "json":
        emit_json(info)
        return
    rows: list[list[Any]] = []
    for key, value in info.items():
        if key == "plugins":
            rows += [[f"plugin.{k}", v] for k, v in value.items()]
        elif key == "manifest":
            rows += [
                [f"manifest.{k}", ", ".join(v) if isinstance(v, list) else v]
                for k, v in value.items()
                if not isinstance(v, dict)
            ]
        elif key == "files":
            rows.append([key, ", ".join(value)])
        elif key == "speculative_decoding_mode":
            rows.append([key, f"{value} ({info['speculative_mode_name']})"])
        elif key != "speculative_mode_name":
            rows.append(
                [
                    key,
                    value
                    if not isinstance(value, dict)
                    else ", ".join(f"{k}={v}" for k, v in value.items()),
                ]
            )
    emit_table(["field", "value"], rows)


COMMANDS: list[click.Command] = [validate_cmd, build_cmd, inspect_cmd]
