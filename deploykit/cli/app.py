"""The `deploykit` Typer app: one module per command group, each with `register(app)`. Heavy modules are
imported inside the commands, so `probe`, `plan` and `render` never import torch or vLLM."""

from __future__ import annotations

import gc
import sys
from typing import Any

import typer
from typer.core import TyperGroup

from deploykit.cli import canary, fixes, plan, probe, profiles, render, serve, trace
from deploykit.errors import DeploykitError


def report_error(exc: DeploykitError) -> int:
    """The one place a user-caused failure is printed: its details (a profile's located issues), then one
    line naming the problem and the way out. Returns the exit code."""
    for line in exc.details:
        typer.echo(line, err=True)
    typer.echo(f"deploykit: {exc.message}", err=True)
    return exc.exit_code


class _ReportingGroup(TyperGroup):
    """The root command group: every command (sub-groups included) runs inside its `invoke`, so a
    DeploykitError from any of them becomes its one line and exit code here, never a traceback. Inside
    the group, not only in `main`, so Typer's CliRunner sees the same exit codes as a person does."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except DeploykitError as exc:
            raise typer.Exit(report_error(exc)) from None


app = typer.Typer(
    cls=_ReportingGroup,
    name="deploykit",
    help="Make a vLLM deployment correct on the GPU it lands on: probe → profile → plan → serve → render.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Registration order is the order `deploykit --help` lists the commands in (groups after commands).
for group in (profiles, probe, plan, fixes, serve, render, canary, trace):
    group.register(app)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
    finally:
        # Results are stored and output flushed by now. Without this the interpreter's last garbage
        # collection walks every object of every module imported (SQLAlchemy, httpx, pydantic): ~0.2 s
        # of `deploykit serve`'s 1 s overhead budget, for memory the OS is about to take back anyway.
        # Not when triton was imported (`deploykit fixes` imports vLLM): its nanobind extension counts
        # the objects still alive at shutdown and prints ~40 "nanobind: leaked instance" lines for the
        # ones the freeze kept from being collected. Skipping the freeze keeps every atexit handler and
        # finalizer running as usual (os._exit would not), and costs time only in that command.
        if "triton" not in sys.modules:
            gc.freeze()
