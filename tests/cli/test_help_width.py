"""`--help` on an 80-column terminal names every option whole and stays within the 80 columns.

Typer's rich help squeezes its option table to the width and cut the longest names
(`--max-restarts-per-…`), so a person could not type the option the help was about.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from deploykit.cli.app import app
from tests.cli_runner import CliRunner

WIDTH = 80


def commands(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group of the app, with the words that reach it (Typer's click is its own copy,
    so groups are told by their subcommands)."""
    yield path, group
    if hasattr(group, "commands"):
        for name, command in sorted(group.commands.items()):
            if not command.hidden:
                yield from commands(command, (*path, name))


ALL = list(commands(typer.main.get_command(app)))


def option_names(command: Any) -> list[str]:
    return [
        name
        for param in command.params
        if param.param_type_name == "option" and not param.hidden
        for name in (*param.opts, *param.secondary_opts)
    ]


def named_whole(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def check_help(text: str, names: list[str]) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not too_wide, "\n".join(too_wide)
    cut = [name for name in names if not named_whole(name, text)]
    assert not cut, f"cut or missing: {cut}\n{text}"


@pytest.mark.parametrize(("path", "command"), ALL, ids=[" ".join(path) or "deploykit" for path, _ in ALL])
def test_help_at_80_columns_names_every_option_whole(path: tuple[str, ...], command: Any) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})

    assert result.exit_code == 0, result.output
    check_help(result.output, [*option_names(command), "--help"])


def test_every_command_is_checked() -> None:
    assert {"serve", "plan", "render helm", "results list"} <= {" ".join(path) for path, _ in ALL}
    assert "--max-restarts-per-hour" in option_names(dict(ALL)[("serve",)])


def test_the_check_catches_a_cut_name() -> None:
    """What the rich table printed before: the name ends in an ellipsis."""
    with pytest.raises(AssertionError, match="max-restarts-per-hour"):
        check_help(
            "│    --max-restarts-per-…          <int range> [x>=0]    Restarts on   │",
            ["--max-restarts-per-hour"],
        )


def test_serve_help_as_a_person_runs_it() -> None:
    """The console script on an 80-column terminal (COLUMNS), not the test runner."""
    result = subprocess.run(
        [str(Path(sys.executable).with_name("deploykit")), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": str(WIDTH)},
    )
    assert result.returncode == 0, result.stderr
    check_help(result.stdout, [*option_names(dict(ALL)[("serve",)]), "--help"])
