"""The `deploykit` command. One function per command; heavy modules are imported inside them, so
`probe`, `plan` and `render` never import torch or vLLM."""

from __future__ import annotations

import gc
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from deploykit.commands.options import FactsOption, FixOption, FormatOption, ProfileOption, TableOrJson

if TYPE_CHECKING:
    from deploykit.facts import ProbeFacts
    from deploykit.fixes.base import FixMode
    from deploykit.profile import LoadedProfile

app = typer.Typer(
    name="deploykit",
    help="Make a vLLM deployment correct on the GPU it lands on: probe → profile → plan → serve → render.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
profiles_app = typer.Typer(help="List and check deployment profiles.", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")

EXIT_USAGE = 2
EXIT_NO_GPU = 3


class PlanFormat(StrEnum):
    text = "text"
    json = "json"
    shell = "shell"


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    typer.echo(f"deploykit: {message}", err=True)
    raise typer.Exit(code)


def gather_facts(facts_file: Path | None) -> ProbeFacts:
    from deploykit.probe import ProbeError, load_facts, probe

    if facts_file is None:
        return probe()
    try:
        return load_facts(str(facts_file))
    except ProbeError as exc:
        fail(str(exc))


def open_profile(name_or_path: str) -> LoadedProfile:
    from deploykit.profile import ProfileError, load_profile

    try:
        return load_profile(name_or_path)
    except ProfileError as exc:
        for issue in exc.issues:
            typer.echo(str(issue), err=True)
        fail(f"{len(exc.issues)} problem(s) in profile {name_or_path}")


def parse_fix_overrides(values: list[str] | None) -> dict[str, FixMode]:
    from deploykit.fixes import FIX_NAMES
    from deploykit.fixes.base import FixMode

    overrides: dict[str, FixMode] = {}
    for value in values or []:
        name, sep, mode = value.partition("=")
        if not sep or name not in FIX_NAMES or mode not in {m.value for m in FixMode}:
            fail(f"--fix {value!r}: expected NAME=on|off|auto with NAME one of {', '.join(FIX_NAMES)}")
        overrides[name] = FixMode(mode)
    return overrides


@app.command()
def probe(
    format: Annotated[
        TableOrJson, typer.Option("--format", "-f", help="table for people, json for machines")
    ] = (TableOrJson.table),
    save: Annotated[Path | None, typer.Option("--save", help="Also write the JSON facts to FILE.")] = None,
) -> None:
    """Read every NVIDIA GPU's facts through NVML (no CUDA context, no torch). Exit 3 when there is no GPU."""
    from deploykit.nvml_reader import document_json, read_probe_document

    document = read_probe_document()
    text = document_json(document)
    if save is not None:
        save.write_text(text + "\n")
    if format is TableOrJson.json:
        typer.echo(text)
    else:  # people can wait for pydantic and rich; `--format json` does without them
        from deploykit.facts import ProbeFacts
        from deploykit.report import print_probe

        print_probe(ProbeFacts.model_validate(document))
    if document["error"]:
        typer.echo(f"deploykit probe: {document['error']}", err=True)
        raise typer.Exit(EXIT_NO_GPU)


@app.command()
def plan(
    profile: ProfileOption,
    facts: FactsOption = None,
    fix: FixOption = None,
    format: Annotated[PlanFormat, typer.Option("--format", "-f")] = PlanFormat.text,
    validate: Annotated[
        bool,
        typer.Option(
            "--validate/--no-validate",
            help="Check the argv with the installed vLLM's own parser (imports vLLM, ~6 s).",
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
        from deploykit.report import print_plan

        print_plan(result)
    if result.errors:
        for error in result.errors:
            typer.echo(f"deploykit plan: error: {error}", err=True)
        raise typer.Exit(EXIT_USAGE)


@profiles_app.command("list")
def profiles_list(
    facts: FactsOption = None,
    dir: Annotated[
        Path | None, typer.Option("--dir", help="Also list the profiles in this directory.")
    ] = None,
    format: FormatOption = TableOrJson.table,
) -> None:
    """Every shipped and user profile: compatible, compatible with warnings, or incompatible with this GPU."""
    from deploykit.profile_list import assess_profiles

    rows = assess_profiles(gather_facts(facts), dir)
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    else:
        from deploykit.report import print_profile_rows

        print_profile_rows(rows)


@app.command()
def fixes(
    format: FormatOption = TableOrJson.table,
) -> None:
    """Every fix, what it patches, and its status against the installed vLLM (imports vLLM)."""
    from deploykit.fix_status import fix_statuses

    rows = fix_statuses()
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    else:
        from deploykit.report import print_fix_rows

        print_fix_rows(rows)


def _register_command_groups() -> None:
    from deploykit.commands import render, serve, trace

    serve.register(app)
    render.register(app)
    trace.register(app)


_register_command_groups()


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        # Results are stored and output flushed by now. Without this the interpreter's last garbage
        # collection walks every object of every module imported (SQLAlchemy, httpx, pydantic): ~0.2 s
        # of `deploykit serve`'s 1 s overhead budget, for memory the OS is about to take back anyway.
        gc.freeze()


if __name__ == "__main__":
    main()
