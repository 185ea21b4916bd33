"""CLI commands owned by the serve stage (being written)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
