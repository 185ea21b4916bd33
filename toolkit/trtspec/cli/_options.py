"""Click options more than one command takes, each declared once: the
engines root (``--engines``: build, repo, bench, deploy, doctor,
serve-llmapi). ``--format`` lives in ``_output``, ``--gpu-memory`` in
``_memory``. A command names what the option means to it in ``help``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

DEFAULT_ENGINES = Path("engines")


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
