"""`deploykit probe`: each GPU's facts through NVML; `--format json` needs neither pydantic nor rich."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deploykit import exit_codes
from deploykit.cli.options import TableOrJson, fail


def probe(
    format: Annotated[
        TableOrJson, typer.Option("--format", "-f", help="table for people, json for machines")
    ] = (TableOrJson.table),
    save: Annotated[Path | None, typer.Option("--save", help="Also write the JSON facts to FILE.")] = None,
) -> None:
    """Read every NVIDIA GPU's facts through NVML (no CUDA context, no torch). Exit 4 when there is no GPU."""
    from deploykit.probe.nvml_reader import document_json, read_probe_document

    document = read_probe_document()
    text = document_json(document)
    if save is not None:
        try:
            save.write_text(text + "\n")
        except OSError as exc:
            fail(f"probe: --save {save}: cannot write the facts file: {exc.strerror}; give a file path")
    if format is TableOrJson.json:
        typer.echo(text)
    else:  # people can wait for pydantic and rich; `--format json` does without them
        from deploykit.cli.report import print_probe
        from deploykit.probe.facts import ProbeFacts

        print_probe(ProbeFacts.model_validate(document))
    if document["error"]:
        typer.echo(f"deploykit probe: {document['error']}", err=True)
        raise typer.Exit(exit_codes.NO_GPU)


def register(app: typer.Typer) -> None:
    app.command()(probe)
