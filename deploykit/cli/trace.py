"""`deploykit trace`: the first module of the served model whose output went non-finite.

Nothing heavy at import time: the orchestration (deploykit.trace.run) loads inside the command.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from deploykit.cli.options import FixOption, ProfileOption


class TraceFormat(StrEnum):
    text = "text"
    json = "json"


CASE_KINDS = ("completion", "chat", "image", "lora_long", "penalties")


def trace(
    profile: ProfileOption,
    fix: FixOption = None,
    case: Annotated[
        str | None,
        typer.Option("--case", help=f"Run only this smoke case kind ({', '.join(CASE_KINDS)})."),
    ] = None,
    prompt: Annotated[
        str | None, typer.Option("--prompt", help="Run one completion with this prompt.")
    ] = None,
    format: Annotated[TraceFormat, typer.Option("--format", "-f")] = TraceFormat.text,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", help="Results store URL (default: $DEPLOYKIT_STORE, else the user's SQLite)."
        ),
    ] = None,
    max_tokens: Annotated[
        int | None, typer.Option("--max-tokens", help="Generate this many tokens per case.", min=1)
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Stream vLLM's log to stderr (default: its file only).")
    ] = False,
) -> None:
    """Start vLLM eager with every module hooked, run the case(s), name the first module that made Inf/NaN.

    Exit 0: nothing non-finite and the cases passed; 1: a culprit, a failing case, or the trace could not
    run; 2: refused before vLLM started (the profile, its plan, or a case its server cannot answer).
    """
    from deploykit.cli.options import fail, parse_fix_overrides
    from deploykit.trace.report import render_text, report_json
    from deploykit.trace.run import TraceOptions, run_trace

    if case is not None and prompt is not None:
        fail("give --case KIND or --prompt TEXT, not both")
    if case is not None and case not in CASE_KINDS:
        fail(f"--case {case!r}: expected one of {', '.join(CASE_KINDS)}")
    options = TraceOptions(
        profile=profile,
        overrides=parse_fix_overrides(fix),
        case=case,
        prompt=prompt,
        store_url=store,
        max_tokens=max_tokens,
        quiet=not verbose,
    )

    from deploykit.untrusted_text import terminal_text

    def say(message: str) -> None:  # the served model's words among them: shown escaped
        typer.echo(terminal_text(message, lines=True), err=True)

    code, report = run_trace(options, say)
    if report is not None:
        typer.echo(
            report_json(report)
            if format is TraceFormat.json
            else terminal_text(render_text(report), lines=True)
        )
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the trace command to the app."""
    app.command()(trace)
