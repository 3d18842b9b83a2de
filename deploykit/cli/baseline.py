"""`deploykit results baseline show|pin|retire`: the fingerprints every run of a key is compared with
(docs/fingerprints.md). Nothing heavy at import time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from deploykit.cli.options import ROW_ID, FormatOption, StoreOption, TableOrJson

if TYPE_CHECKING:
    from deploykit.results.baseline import Baseline

baseline_app = typer.Typer(
    help="Fingerprint baselines: what a healthy deployment of each key answers.", no_args_is_help=True
)


def _state(baseline: Baseline) -> str:
    if baseline.status == "retired":
        return "retired"
    if baseline.pinned:
        return "pinned"
    return "confirmed" if baseline.confirmed_by else "provisional"


def _print(baselines: list[Baseline], format: TableOrJson, title: str) -> None:
    if format is TableOrJson.json:
        import json

        typer.echo(
            json.dumps([b.model_dump(mode="json", exclude={"fingerprint"}) for b in baselines], indent=2)
        )
        return
    from rich.table import Table

    from deploykit.cli.report import output_console

    table = Table(title=title)
    for column in (
        "id",
        "key",
        "state",
        "row",
        "host",
        "since (UTC)",
        "confirmed by",
        "model",
        "device",
        "note",
    ):
        table.add_column(column, no_wrap=column in ("id", "key", "state"))
    for b in baselines:
        table.add_row(
            str(b.id),
            b.key[:12],
            _state(b),
            f"#{b.result_id}",
            b.hostname,
            b.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            b.confirmed_by or "-",
            str(b.key_parts.get("model", "-")),
            str(b.key_parts.get("device", "-")),
            b.note,
        )
    output_console(highlight=False).print(table)


@baseline_app.command("show")
def baseline_show(
    store: StoreOption = None,
    key: Annotated[str | None, typer.Option("--key", help="Only this key (its first characters do).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Retired baselines too.")] = False,
    format: FormatOption = TableOrJson.table,
) -> None:
    """The active baselines (provisional until a second host agrees; confirmed; pinned)."""
    from deploykit.results.stores import opened_store

    with opened_store(store) as opened:
        found = opened.baselines(include_retired=all_)
        where = opened.display_url
    if key is not None:
        found = [b for b in found if b.key.startswith(key)]
    _print(found, format, f"baselines in {where}")


@baseline_app.command("pin")
def baseline_pin(
    result_id: Annotated[
        int,
        typer.Argument(metavar="ROW", parser=ROW_ID, help="A result id (`results list`) with a fingerprint."),
    ],
    store: StoreOption = None,
    note: Annotated[str, typer.Option("--note", help="Why, for whoever reads it later.")] = "",
) -> None:
    """Make ROW's fingerprint the confirmed baseline of its key (the key's active one is retired)."""
    from deploykit.results.stores import opened_store

    with opened_store(store) as opened:
        baseline = opened.pin_baseline(result_id, note=note or "pinned by an operator")
    typer.echo(
        f"baseline #{baseline.id} of key {baseline.key[:12]}: row #{result_id} ({baseline.hostname}), pinned"
    )


@baseline_app.command("retire")
def baseline_retire(
    baseline_id: Annotated[
        int, typer.Argument(metavar="ID", parser=ROW_ID, help="A baseline id from `results baseline show`.")
    ],
    store: StoreOption = None,
    note: Annotated[str, typer.Option("--note", help="Why, for whoever reads it later.")] = "",
) -> None:
    """Retire a baseline: the next healthy run of its key becomes the new one."""
    from deploykit.results.stores import opened_store

    with opened_store(store) as opened:
        baseline = opened.retire_baseline(baseline_id, note=note or "retired by an operator")
    typer.echo(
        f"baseline #{baseline.id} of key {baseline.key[:12]} retired; the next healthy run replaces it"
    )
