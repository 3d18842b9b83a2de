"""`deploykit fixes`: each fix and its status against the installed vLLM."""

from __future__ import annotations

import typer

from deploykit.cli.options import FormatOption, TableOrJson


def fixes(
    format: FormatOption = TableOrJson.table,
) -> None:
    """Every fix, what it patches, and its status against the installed vLLM (imports vLLM)."""
    from deploykit.cli.options import quiet_libraries
    from deploykit.fixes.status import fix_statuses

    with quiet_libraries():  # the target checks import vLLM, which logs and warns as it loads
        rows = fix_statuses()
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps([row.model_dump(mode="json") for row in rows], indent=2))
    else:
        from deploykit.cli.report import print_fix_rows

        print_fix_rows(rows)


def register(app: typer.Typer) -> None:
    app.command()(fixes)
