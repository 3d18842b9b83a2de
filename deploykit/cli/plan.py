"""`deploykit plan`: the fixes a profile gets on a GPU, and the exact `vllm serve` launch."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from deploykit.cli.options import (
    EXIT_USAGE,
    FactsOption,
    FixOption,
    ProfileOption,
    gather_facts,
    open_profile,
    parse_fix_overrides,
)


class PlanFormat(StrEnum):
    text = "text"
    json = "json"
    shell = "shell"


def plan(
    profile: ProfileOption,
    facts: FactsOption = None,
    fix: FixOption = None,
    format: Annotated[PlanFormat, typer.Option("--format", "-f")] = PlanFormat.text,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate/--no-validate",
            help="Check the argv as the installed vLLM's parser would (its option table is read once "
            "per vLLM version and cached; vLLM is not imported here).",
        ),
    ] = True,
) -> None:
    """Decide the fixes for a profile on a GPU and write the exact `vllm serve` launch."""
    from deploykit.plan import make_plan, validate_plan

    loaded = open_profile(profile)
    result = make_plan(loaded, gather_facts(facts), parse_fix_overrides(fix))
    if validate:
        validate_plan(result)
    if format is PlanFormat.json:
        typer.echo(result.model_dump_json(indent=2))
    elif format is PlanFormat.shell:
        typer.echo(result.shell())
    else:
        from deploykit.cli.report import print_plan

        print_plan(result)
    if result.errors:
        for error in result.errors:
            typer.echo(f"deploykit plan: error: {error}", err=True)
        raise typer.Exit(EXIT_USAGE)


def register(app: typer.Typer) -> None:
    app.command()(plan)
