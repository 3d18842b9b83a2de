"""Options, formats and helpers shared by several commands, defined once so they read the same everywhere.

Nothing heavy at import: each helper imports what it needs when it runs."""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from deploykit import exit_codes
from deploykit.errors import UsageError

if TYPE_CHECKING:
    from deploykit.canary.settings import Setting
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import FixMode, LoadedProfile


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


# --- numbers -------------------------------------------------------------------------------------------
# Every numeric option goes through one of these two types. click's own FLOAT takes "nan" and "inf" (and
# `x >= 0` is False for NaN only by luck of the comparison), and its INT takes 10**20, which SQLite then
# refuses with an OverflowError. These refuse both on the command line, as a one-line usage error.

SECONDS_MAX = 7 * 24 * 3600.0
"""The longest wait any option may ask for: a week. Longer is a typo, and time.sleep would overflow
for the absurd values (1e20) long before the heat death of the server."""

SQL_INTEGER_MAX = 2**63 - 1
"""The largest integer SQLite and PostgreSQL BIGINT store: a row id or limit beyond it cannot exist."""


class FiniteFloat:
    """A real number in [low, high] (or (low, high] with `low_open`): never NaN or infinity.
    A Typer parser: `typer.Option("--every", parser=seconds(0.1))`."""

    __name__ = "number"  # what Typer's help shows as the metavar

    def __init__(self, low: float, high: float, *, low_open: bool = False, unit: str = "") -> None:
        self.low, self.high, self.low_open, self.unit = low, high, low_open, unit
        self.__name__ = unit or "number"

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}]{unit}"

    def __call__(self, value: str | float) -> float:
        if isinstance(value, float | int) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                raise typer.BadParameter(f"{value!r} is not a number in {self.describe()}") from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"{value!r} is not a finite number in {self.describe()}")
        too_low = number <= self.low if self.low_open else number < self.low
        if too_low or number > self.high:
            raise typer.BadParameter(f"{value!r} is not in {self.describe()}")
        return number


class WholeNumber:
    """An integer in [low, high], written as digits (no 1e3, no 1.0): never beyond what SQL stores.
    A Typer parser: `typer.Option("--limit", parser=ROW_LIMIT)`."""

    __name__ = "integer"

    def __init__(self, low: int, high: int = SQL_INTEGER_MAX) -> None:
        self.low, self.high = low, high

    def __call__(self, value: str | int) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if not text.lstrip("+-").isdigit() or len(text) > 40:
                raise typer.BadParameter(f"{value!r} is not a whole number in [{self.low}, {self.high}]")
            number = int(text)
        if not self.low <= number <= self.high:
            raise typer.BadParameter(f"{value!r} is not in [{self.low}, {self.high}]")
        return number


def seconds(low: float = 0.0, *, low_open: bool = False, high: float = SECONDS_MAX) -> FiniteFloat:
    """A duration option's parser, e.g. `typer.Option("--every", parser=seconds(0.1))`."""
    return FiniteFloat(low, high, low_open=low_open, unit="seconds")


def setting_parser(setting: Setting, *, off: bool = False) -> FiniteFloat | WholeNumber:
    """The option type of a canary setting, from its declared bounds (`deploykit.canary.settings`); `off`:
    0 is taken too (serve's `--canary-every 0`: no canary). What the type lets through (`--metrics-every`
    between 0 and 0.1), `check_settings` refuses in one line naming the option."""
    bounds = setting.bounds
    if bounds is None:
        raise ValueError(f"{setting.name} has no bounds: it is not a number")
    if bounds.whole:
        return WholeNumber(int(bounds.low), int(bounds.high))
    if bounds.off or off:
        return seconds(0.0, high=bounds.high)
    return seconds(bounds.low, low_open=bounds.low_open, high=bounds.high)


ROW_ID = WholeNumber(1)
"""A stored result's id (`results show ID`)."""

ROW_LIMIT = WholeNumber(1, 1_000_000)
"""How many rows to list (`results list --limit`)."""

PORT = WholeNumber(1, 65535)
"""A TCP port."""


def fail(message: str, code: int = exit_codes.USAGE) -> NoReturn:
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


# One `--store` for every command that reads or writes rows (serve, smoke, results, results baseline).
StoreOption = Annotated[
    str | None,
    typer.Option(
        "--store",
        help="Results store URL: sqlite:///PATH or postgresql://USER:PASS@HOST/DB "
        "(default: $DEPLOYKIT_STORE, else SQLite in the user data directory).",
    ),
]
