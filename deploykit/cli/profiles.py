"""`deploykit profiles list`: every shipped and user profile judged against one set of GPU facts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deploykit.cli.options import FactsOption, FormatOption, TableOrJson, gather_facts

profiles_app = typer.Typer(help="List and check deployment profiles.", no_args_is_help=True)


@profiles_app.command("list")
def profiles_list(
    facts: FactsOption = None,
    dir: Annotated[
        Path | None, typer.Option("--dir", help="Also list the profiles in this directory.")
    ] = None,
    format: FormatOption = TableOrJson.table,
) -> None:
    """Every shipped and user profile: compatible, compatible with warnings, or incompatible with this GPU."""
    from deploykit.plan import make_plan
    from deploykit.profile.catalog import assess_profiles

    rows = assess_profiles(gather_facts(facts), dir, make_plan=make_plan)
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    else:
        from deploykit.cli.report import print_profile_rows

        print_profile_rows(rows)


def register(app: typer.Typer) -> None:
    app.add_typer(profiles_app, name="profiles")
