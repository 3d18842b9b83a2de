"""The command line: `app` (Typer) and `main` (the `deploykit` script). Nothing outside cli/ imports it."""

from deploykit.cli.app import app, main

__all__ = ["app", "main"]
