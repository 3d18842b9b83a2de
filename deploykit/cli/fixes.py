"""`deploykit fixes`: each fix and its status against the installed vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from deploykit.cli.options import FormatOption, TableOrJson

if TYPE_CHECKING:
    from deploykit.fixes.status import FixRow


def fixes(
    format: FormatOption = TableOrJson.table,
) -> None:
    """Every fix, what it patches, and its status against the installed vLLM (imports vLLM)."""
    from deploykit.cli.options import quiet_libraries
    from deploykit.cli.progress import say_if_slow
    from deploykit.fixes.status import fix_statuses

    # the target checks import vLLM, which logs and warns as it loads (and takes seconds)
    with quiet_libraries(), say_if_slow("deploykit fixes: importing vLLM to check each fix's target ..."):
        rows = fix_statuses()
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    else:
        from deploykit.cli.report import print_fix_rows

        print_fix_rows(rows)
        typer.echo(tested_range_line(rows))


def tested_range_line(rows: list[FixRow]) -> str:
    """The tested range, and where the installed vLLM stands: outside it every target is still checked and
    a mismatch still stops vLLM, but nothing has proven the fixes there."""
    from deploykit.vllm_compat import TESTED_VLLM

    version = rows[0].vllm_version if rows else None
    where = {True: "inside it", False: "OUTSIDE it: the fixes are unproven there", None: "unknown"}
    installed = (
        f"installed vLLM {version}: {where[rows[0].in_tested_range]}" if version else "no vLLM installed"
    )
    return f"tested with vLLM {TESTED_VLLM}; {installed}"


def register(app: typer.Typer) -> None:
    app.command()(fixes)
