"""Click options more than one command module takes, each declared once:
the engines root (``--engines``: build, repo, bench, deploy, doctor,
serve-llmapi), the TensorRT-LLM examples folder (``--examples-dir``: build,
doctor), the address a server binds (``--host``: serve, serve-llmapi; loopback
by default), the Kubernetes namespace (``--namespace``: deploy k8s, deploy
dynamo, rollout), the benchmark gates (``--fail-on``: bench, compare).
``--format`` lives in ``_output``, ``--gpu-memory`` in
``_memory``. A command names what the option means to it in ``help``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

DEFAULT_ENGINES = Path("engines")
#: what a server binds unless told otherwise: loopback only
DEFAULT_HOST = "127.0.0.1"


def engines_option(help: str, *aliases: str) -> Callable[[Any], Any]:
    """``--engines`` (and ``aliases``) into the parameter ``engines_root``."""
    return click.option(
        "--engines",
        *aliases,
        "engines_root",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_ENGINES,
        show_default=True,
        help=help,
    )


examples_dir_option = click.option(
    "--examples-dir",
    metavar="DIR",
    help="TensorRT-LLM examples folder (default: the spec's stack.examples_dir).",
)


def host_option(help: str) -> Callable[[Any], Any]:
    """``--host``: the address a server binds, loopback unless widened."""
    return click.option("--host", default=DEFAULT_HOST, show_default=True, help=help)


def namespace_option(help: str | None = None) -> Callable[[Any], Any]:
    """``--namespace``: the Kubernetes namespace."""
    return click.option("--namespace", default="default", show_default=True, help=help)


def fail_on_option(
    help: str, metrics: Callable[[], Mapping[str, Any]] | None = None
) -> Callable[[Any], Any]:
    """``--fail-on GATES`` into the parameter ``gates`` (``trtspec.bench.gates``),
    refused at parse time naming the bad part; ``metrics`` loads the names a
    gate may use (default: the bench's)."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
        from trtspec.bench.gates import parse_gates
        from trtspec.errors import BenchError

        try:
            return parse_gates(value) if metrics is None else parse_gates(value, metrics())
        except BenchError as exc:
            raise click.BadParameter(
                exc.message.removeprefix("--fail-on: ") + (f" ({exc.hint})" if exc.hint else "")
            ) from None

    return click.option("--fail-on", "gates", callback=parse, metavar="GATES", help=help)
