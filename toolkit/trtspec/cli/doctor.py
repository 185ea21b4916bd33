"""``trtspec doctor [SPEC]``: a thin Click wrapper over ``trtspec.doctor``.
The checks go to stdout (``--format table|json``); any blocker ends with
``Error:`` on stderr and exit 1."""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli._options import engines_option, examples_dir_option
from trtspec.cli._output import emit_json, emit_table, format_option
from trtspec.errors import TrtspecError


@click.command("doctor")
@click.argument("spec_path", metavar="[SPEC]", required=False, type=click.Path(dir_okay=False))
@engines_option("Engines root (where downloaded model configs are found).")
@examples_dir_option
@format_option
def doctor_cmd(
    spec_path: str | None, engines_root: Path, examples_dir: str | None, fmt: str
) -> None:
    """Check this machine before a long build: TensorRT-LLM version, build
    scripts, GPUs and their memory, tritonserver and its backend, /dev/shm."""
    from trtspec import doctor

    spec = plan = None
    if spec_path is not None:
        from trtspec.flows import stage_plan
        from trtspec.spec import load_spec

        spec = load_spec(spec_path)
        plan = stage_plan(spec, engines_root, examples_dir=examples_dir, spec_path=spec_path)
    checks = doctor.run_checks(spec, plan)
    bad = doctor.blockers(checks)
    if fmt == "json":
        emit_json(
            {
                "spec": None if spec is None else spec.name,
                "ok": not bad,
                "checks": doctor.to_dict(checks),
            }
        )
    else:
        emit_table(
            ["check", "status", "detail", "what to do"],
            [[c.name, c.status, c.detail, c.fix] for c in checks],
        )
    if bad:
        raise TrtspecError(
            f"{len(bad)} blocker{'s' if len(bad) != 1 else ''}: " + ", ".join(c.name for c in bad),
            "fix the lines marked blocker above, then rerun `trtspec doctor`",
        )


COMMANDS: list[click.Command] = [doctor_cmd]
