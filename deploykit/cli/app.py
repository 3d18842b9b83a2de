"""The `deploykit` Typer app: one module per command group, each with `register(app)`. Heavy modules are
imported inside the commands, so `probe`, `plan` and `render` never import torch or vLLM."""

from __future__ import annotations

import functools
import gc
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

from deploykit import exit_codes
from deploykit.errors import DeploykitError, UsageError
from deploykit.untrusted_text import terminal_text


def report_error(exc: DeploykitError) -> int:
    """The one place a user-caused failure is printed: its details (a profile's located issues), then one
    line naming the problem and the way out. Returns the exit code. A message may quote a server, a store
    or a file: what a terminal would act on is shown escaped (deploykit.untrusted_text)."""
    for line in exc.details:
        typer.echo(terminal_text(line), err=True)
    typer.echo(f"deploykit: {terminal_text(exc.message)}", err=True)
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

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        """A command-line mistake (unknown option, value out of range, missing argument) is one line
        too, like every other user error, instead of Typer's usage banner and boxed message."""
        plain_help(self)
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
        except typer.TyperException as exc:  # the base of Typer's (click's) parsing errors
            sys.exit(report_usage_error(exc))
        except typer.Abort:
            typer.echo("deploykit: aborted", err=True)
            sys.exit(exit_codes.FAILED)
        sys.exit(code if isinstance(code, int) else exit_codes.OK)


def plain_help(command: Any) -> None:
    """Click's help layout for the command and everything under it: Typer's rich option table squeezed
    to 80 columns cut the longest option names (`--max-restarts-per-…`); click's layout puts a long name
    on its own line, whole, and wraps the help to the terminal, at most 80 columns. A command's line in
    its group's list is its help's whole first paragraph (click would cut it at the first sentence)."""
    command.rich_markup_mode = None
    for subcommand in getattr(command, "commands", {}).values():
        if subcommand.short_help is None and subcommand.help:
            subcommand.short_help = " ".join(subcommand.help.strip().split("\n\n")[0].split())
        plain_help(subcommand)


def report_usage_error(exc: typer.TyperException) -> int:
    """Typer's own message, with the command's help named as the way out."""
    if type(exc).__name__ == "NoArgsIsHelpError":
        return exc.exit_code  # a bare group: its help is printed already
    message = exc.format_message().strip().rstrip(".")
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        message += f" (see '{ctx.command_path} --help')"
    error = UsageError(message)
    error.exit_code = exc.exit_code
    return report_error(error)


app = typer.Typer(
    cls=_ReportingGroup,
    name="deploykit",
    help="Make a vLLM deployment correct on the GPU it lands on: probe → profile → plan → serve → render.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Registration order is the order `deploykit --help` lists the commands in (groups after commands).
COMMAND_MODULES: tuple[str, ...] = (
    "profiles",
    "probe",
    "plan",
    "advisories",
    "fixes",
    "serve",
    "gate",
    "render",
)
COMMAND_MODULES += ("addon", "canary", "trace")
# The pod's plugin wheel leaves out the commands nothing in a pod runs (deploykit.render.plugin_wheel
# POD_LEFT_OUT_COMMANDS, for the wheel's size cap): without their module, the command is not there.
for name in COMMAND_MODULES:
    try:
        module = importlib.import_module(f"deploykit.cli.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"deploykit.cli.{name}":
            raise
        continue
    module.register(app)


@functools.cache
def root_command() -> TyperGroup:
    """The click command tree Typer builds from `app`. Building it reads every command's signature and
    type hints (~40 ms); `app()` would build it again on each call, which a process that runs many commands
    (the tests' forked command line, their CliRunner) pays each time. With pretty exceptions off, calling
    it is what `app()` does."""
    command = typer.main.get_command(app)
    assert isinstance(command, TyperGroup)  # `app` is built with cls=_ReportingGroup
    return command


def main() -> None:
    try:
        root_command()()
    except KeyboardInterrupt:
        sys.exit(exit_codes.INTERRUPTED)
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
