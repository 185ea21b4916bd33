"""The CLI's one error boundary: expected errors → ``Error:``/``Hint:`` on
stderr and exit 1 (3 for a failed gate); usage errors exit 2 (Click);
unexpected exceptions print one line unless ``TRTSPEC_DEBUG=1``."""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from trtspec.errors import TrtspecError, os_error


def debug_enabled() -> bool:
    return os.environ.get("TRTSPEC_DEBUG", "") not in ("", "0", "false", "no")


def report_error(exc: BaseException) -> int:
    """Print ``exc`` for a human and return the exit code to use."""
    if isinstance(exc, OSError):
        exc = os_error(exc) or exc
    if isinstance(exc, TrtspecError):
        click.echo(f"Error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"Hint: {exc.hint}", err=True)
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        click.echo("Interrupted.", err=True)
        return 130
    click.echo(f"Error: unexpected {type(exc).__name__}: {exc}", err=True)
    click.echo("Hint: rerun with TRTSPEC_DEBUG=1 for a traceback, and report it.", err=True)
    return 1


def _quiet_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


class BoundaryGroup(click.Group):
    """A group whose ``invoke`` is the error boundary for every subcommand."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except BrokenPipeError:
            # `trtspec … | head`: the reader left; stop quietly, as a Unix tool
            # would, and keep the interpreter's final flush from failing again.
            _quiet_stdout()
            ctx.exit(1)
        except BaseException as exc:  # the boundary: everything else ends here
            if debug_enabled():
                raise
            if isinstance(exc, SystemExit):
                raise
            code = report_error(exc)
            sys.stderr.flush()
            ctx.exit(code)
