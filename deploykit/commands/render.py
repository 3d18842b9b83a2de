"""`deploykit render systemd|helm` (being built: issue 8)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the render commands to the app."""
