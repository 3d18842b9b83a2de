"""`deploykit plan`: the fixes a profile gets on a GPU, and the exact `vllm serve` launch."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from deploykit.cli.options import (
    FactsOption,
    FixOption,
    ProfileOption,
    gather_facts,
    open_profile,
    parse_fix_overrides,
)
from deploykit.errors import PlanError


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
    from deploykit.cli.progress import say_if_slow
    from deploykit.plan import make_plan, validate_plan

    with say_if_slow("deploykit plan: planning, and checking the argv against vLLM's options ..."):
        loaded = open_profile(profile)
        result = make_plan(loaded, gather_facts(facts), parse_fix_overrides(fix))
        if validate:
            validate_plan(result)
    if format is PlanFormat.json:
        typer.echo(result.model_dump_json(indent=2))  # `errors` says it must not run; exit code 2 too
    elif format is PlanFormat.shell:
        for warning in result.warnings:  # stdout stays a runnable script
            typer.echo(f"deploykit plan: warning: {warning}", err=True)
        if not result.errors:  # a plan with errors prints no runnable command
            from deploykit import __version__

            typer.echo(
                f"# Needs deploykit {__version__} installed beside vLLM (same Python environment): its "
                "plugin applies DEPLOYKIT_FIXES"
            )
            typer.echo(result.shell())
    else:
        from deploykit.cli.report import print_plan

        print_plan(result)
    if result.errors:
        raise PlanHasErrors(profile, result.errors)


class PlanHasErrors(PlanError):
    """Each error on its own line, then one line naming the profile."""

    def __init__(self, profile: str, errors: list[str]) -> None:
        super().__init__(
            f"the plan for {profile} has {len(errors)} error(s) (listed above); no launch command printed"
        )
        self.errors = errors

    @property
    def details(self) -> list[str]:
        return [f"deploykit plan: error: {error}" for error in self.errors]


def register(app: typer.Typer) -> None:
    app.command()(plan)
