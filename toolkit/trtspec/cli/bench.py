"""CLI commands owned by the bench stage (being written)."""

from __future__ import annotations

import click

COMMANDS: list[click.Command] = []
