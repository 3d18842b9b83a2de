"""Options and formats shared by several commands, defined once so their help reads the same everywhere."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class TableOrJson(StrEnum):
    table = "table"
    json = "json"


FormatOption = Annotated[
    TableOrJson, typer.Option("--format", "-f", help="table for people, json for machines")
]
ProfileOption = Annotated[
    str,
    typer.Option("--profile", "-p", help="A profile file, or the bare name of a shipped/user profile."),
]
FactsOption = Annotated[
    Path | None,
    typer.Option(
        "--facts", help="Use a saved `deploykit probe --save FILE` instead of probing this machine."
    ),
]
FixOption = Annotated[
    list[str] | None,
    typer.Option("--fix", help="Override a fix: NAME=on|off|auto (repeatable)."),
]
