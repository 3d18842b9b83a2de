"""The `deploykit` Typer app: one module per command group, each with `register(app)`. Heavy modules are
imported inside the commands, so `probe`, `plan` and `render` never import torch or vLLM."""

from __future__ import annotations

import gc
import sys

import typer

from deploykit.cli import fixes, plan, probe, profiles, render, serve

app = typer.Typer(
    name="deploykit",
    help="Make a vLLM deployment correct on the GPU it lands on: probe → profile → plan → serve → render.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Registration order is the order `deploykit --help` lists the commands in (groups after commands).
for group in (profiles, probe, plan, fixes, serve, render):
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
