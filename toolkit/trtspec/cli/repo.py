"""CLI commands owned by the repo stage (being written)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
