"""The ``--gpu-memory`` option and the printed GPU memory plan shared by
``validate``, ``build --dry-run`` and ``repo`` (the estimate itself lives in
``trtspec.memory``). Tables go to stdout after the command's own table;
warnings to stderr."""

from __future__ import annotations

from typing import Any

import click

from trtspec.cli._output import render_table


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from trtspec.memory import MemoryPlanError, parse_size

    if value is None:
        return None
    try:
        return parse_size(value)
    except MemoryPlanError as exc:
        raise click.BadParameter(f"{exc.message}; {exc.hint}") from None


gpu_memory_option = click.option(
    "--gpu-memory",
    "gpu_bytes",
    metavar="SIZE",
    callback=_size,
    help="Memory of one GPU (e.g. 80GiB): check the engines fit and size each KV cache.",
)


def memory_for(spec: Any, plan: Any, gpu_bytes: int | None) -> Any:
    """The memory plan of a GPU spec (None for the reference backend, whose
    engines run on the CPU), with its warnings echoed on stderr: made once,
    then handed to the stages that size KV caches (``Flow.files``,
    ``Flow.assemble``)."""
    from trtspec.flows import flow_for

    if not spec.backend.gpu:
        if gpu_bytes is not None:
            click.echo(
                "Warning: --gpu-memory is ignored: the reference backend runs on the CPU", err=True
            )
        return None
    flow = flow_for(spec)
    mp = flow.memory_plan(spec, plan, gpu_bytes)
    for message in flow.memory_warnings(mp):
        click.echo(f"Warning: {message}", err=True)
    return mp


def memory_table(mp: Any) -> str:
    """The plan as text: one row per engine, then one per server."""
    from trtspec.memory import gib

    gpu = "no --gpu-memory given" if mp.gpu is None else f"GPU {gib(mp.gpu)}"
    head = f"GPU memory plan (estimate per GPU; {gpu})"
    engines = render_table(
        ["engine", "weights", "kv/token", "kv full batch", "kv fraction", "note"], mp.engine_rows()
    )
    servers = render_table(
        ["server", "engines", "needs at least", "needs for full KV", "fit"], mp.server_rows()
    )
    return f"\n{head}\n{engines}\n\n{servers}"
