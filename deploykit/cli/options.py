"""Options, formats and helpers shared by several commands, defined once so they read the same everywhere.

Nothing heavy at import: each helper imports what it needs when it runs."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from deploykit.errors import UsageError

if TYPE_CHECKING:
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import FixMode, LoadedProfile

EXIT_USAGE = 2
EXIT_NO_GPU = 3


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


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """Stop the command: the CLI's one error handler prints `deploykit: MESSAGE` and exits with `code`."""
    error = UsageError(message)
    error.exit_code = code
    raise error


def gather_facts(facts_file: Path | None) -> ProbeFacts:
    """The saved facts in `facts_file` (a FactsError names the file if unusable), else a probe."""
    from deploykit.probe.load import load_facts, probe

    if facts_file is None:
        return probe()
    return load_facts(str(facts_file))


def open_profile(name_or_path: str) -> LoadedProfile:
    """The profile; a ProfileError lists every located issue, then one line naming the profile."""
    from deploykit.profile.load import load_profile

    return load_profile(name_or_path)


def parse_fix_overrides(values: list[str] | None) -> dict[str, FixMode]:
    from deploykit.plan import FIX_NAMES
    from deploykit.profile.schema import FixMode

    overrides: dict[str, FixMode] = {}
    for value in values or []:
        name, sep, mode = value.partition("=")
        if not sep or name not in FIX_NAMES or mode not in {m.value for m in FixMode}:
            fail(
                f"--fix {value!r}: expected NAME=on|off|auto with NAME one of {', '.join(FIX_NAMES)} "
                "(see `deploykit fixes`)"
            )
        overrides[name] = FixMode(mode)
    return overrides


@contextlib.contextmanager
def quiet_libraries() -> Iterator[None]:
    """Around code that imports vLLM (and torch, triton) into the CLI: their chatter stays off stderr.

    deploykit's stderr holds deploykit's own lines only (they start with `deploykit`). vLLM logs through
    its own handler at VLLM_LOGGING_LEVEL, read when vLLM is imported: ERROR unless the user set it.
    Records logged before any handler exists (vLLM's import-time "Triton is installed, but ..." comes
    before vLLM configures its logger) would reach Python's last-resort stderr handler: a NullHandler on
    the root logger takes them instead. Python warnings raised meanwhile are dropped.
    """
    import logging
    import warnings

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
