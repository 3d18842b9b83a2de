"""`deploykit addon` (rendered manifests on stdin, the same with deploykit added on stdout) and `deploykit
render addon-plugin` (the Helm 4 post-renderer plugin that runs it): docs/addon.md. The work is
deploykit.render.addon's. No pod runs either (the plugin wheel leaves this module out)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import click
import typer

from deploykit.cli.options import FixOption, ProfileOption


def addon(
    profile: ProfileOption,
    facts: Annotated[Path, typer.Option("--facts", help="The target GPU's `deploykit probe --save` file.")],
    fix: FixOption = None,
    name: Annotated[
        str | None, typer.Option("--name", help="The release's name: names the ConfigMaps written.")
    ] = None,
    source: Annotated[
        str,
        typer.Option(
            "--plugin-source",
            click_type=click.Choice(["configmap", "image"]),
            help="The wheel in a ConfigMap, or deploykit installed in the vLLM image.",
        ),
    ] = "configmap",
    stream: Annotated[str | None, typer.Option("--in", "-i", help="Read this file, not stdin.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Add it though the profile's requires fail.")
    ] = False,
) -> None:
    """Add deploykit to the vLLM containers of rendered manifests: stdin to stdout (docs/addon.md)."""
    from deploykit.cli.options import parse_fix_overrides
    from deploykit.render.addon import AddonOptions, read_stream, run_addon

    options = AddonOptions.model_validate({"name": name, "plugin_source": source})
    text = read_stream(stream, sys.stdin.buffer)
    result = run_addon(profile, str(facts), parse_fix_overrides(fix), options, text, force=force)
    for note in result.warnings:
        typer.echo(f"deploykit addon: warning: {note}", err=True)
    sys.stdout.write(result.text)


def addon_plugin(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the plugin into.")],
    python: Annotated[
        str | None, typer.Option("--python", help="The Python it runs (default: this one).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite files changed since.")] = False,
) -> None:
    """The Helm 4 post-renderer plugin that runs `deploykit addon` (docs/addon.md)."""
    from deploykit.render.addon import helm_plugin
    from deploykit.render.common import write_files

    done = write_files(helm_plugin(python or sys.executable), out, force=force)
    for path in done.written:
        typer.echo(str(path))
    for path, why in done.kept:
        typer.echo(f"deploykit render: {path}: {why}", err=True)


def register(app: typer.Typer) -> None:
    from deploykit.cli.render import render_app

    app.command("addon")(addon)
    render_app.command("addon-plugin")(addon_plugin)
