"""Typer's CliRunner over deploykit's command tree as the `deploykit` script runs it: built once per process
(`deploykit.cli.app.root_command`), not again on each invoke as Typer's runner does (~40 ms each: Typer
reads every command's signature and type hints). Any other Typer app is invoked as Typer's runner does."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import typer
import typer.testing

from deploykit.cli.app import app as deploykit_app
from deploykit.cli.app import root_command


class CliRunner(typer.testing.CliRunner):
    def invoke(  # type: ignore[override]
        self, app: typer.Typer, args: str | Sequence[str] | None = None, **kwargs: Any
    ) -> typer.testing.Result:
        if app is not deploykit_app:
            return super().invoke(app, args, **kwargs)
        builds = typer.testing._get_command  # the name Typer's runner builds the tree through
        typer.testing._get_command = lambda _: root_command()
        try:
            return super().invoke(app, args, **kwargs)
        finally:
            typer.testing._get_command = builds
