"""`deploykit serve`, `deploykit smoke`, `deploykit results` (being built: issue 7)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the serving commands to the app."""
