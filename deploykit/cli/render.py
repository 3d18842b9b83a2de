"""`deploykit render systemd|helm`: the planned launch as a systemd unit or a Helm chart.

Both start from the same plan as `deploykit plan`, so all three forms carry the same vLLM argv and fix
environment. Nothing here imports torch or vLLM, at import time or when rendering.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from deploykit.cli.options import FactsOption, FixOption, ProfileOption

if TYPE_CHECKING:
    from collections.abc import Callable

    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile
    from deploykit.render.common import RenderResult

render_app = typer.Typer(
    help="Write the planned launch as a systemd unit or a Helm chart.", no_args_is_help=True
)

OutOption = Annotated[Path, typer.Option("--out", "-o", help="Directory to write the files into.")]
ForceOption = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Overwrite files in --out that were changed since deploykit wrote them (a filled-in secrets "
        "file is kept even so), and render a profile whose `requires` the facts fail (a warning then).",
    ),
]


def _render(
    kind: str,
    profile: str,
    out: Path,
    facts: Path | None,
    fix: list[str] | None,
    render: Callable[[Plan, LoadedProfile], RenderResult],
    force: bool = False,
) -> None:
    """Open the profile, plan it for the target, render, then print the warnings and the written paths."""
    from deploykit.cli.options import fail, gather_facts, open_profile, parse_fix_overrides
    from deploykit.render.common import RenderError, plan_for_render, requirements_refusal, write_files

    loaded = open_profile(profile)
    try:
        plan = plan_for_render(loaded, gather_facts(facts), parse_fix_overrides(fix))
        refused = requirements_refusal(plan)
        if refused is not None and not force:
            fail(f"render {kind}: {refused} (--force renders it anyway)")
        result = render(plan, loaded)
    except RenderError as exc:
        fail(f"render {kind}: {exc}")
    if refused is not None:
        typer.echo(f"deploykit render: warning: {refused}, rendered anyway (--force)", err=True)
    for warning in result.warnings:
        typer.echo(f"deploykit render: warning: {warning}", err=True)
    try:
        done = write_files(result, out, force=force, owner=loaded.profile.name)
    except RenderError as exc:
        fail(f"render {kind}: {exc}")
    for path in done.written:
        typer.echo(str(path))
    for path, why in done.kept:
        typer.echo(f"deploykit render: {path}: {why}", err=True)


@render_app.command("systemd")
def render_systemd(
    profile: ProfileOption,
    out: OutOption,
    facts: FactsOption = None,
    fix: FixOption = None,
    force: ForceOption = False,
    prefix: Annotated[
        Path | None,
        typer.Option(
            "--prefix",
            help="The environment on the target host whose bin/ holds vllm and deploykit "
            "(default: this deploykit's environment).",
        ),
    ] = None,
    gpus: Annotated[
        str | None,
        typer.Option(
            "--gpus",
            metavar="I,J",
            help="The GPU indices the server unit opens (default: 0..N-1 for the N GPUs the plan needs): "
            "give each profile on one host its own. Units already in --out that open the same GPU are "
            "named in a warning.",
        ),
    ] = None,
) -> None:
    """A hardened service unit, a smoke companion, a secrets file template and a sysusers entry."""
    import sys

    from deploykit.cli.options import fail
    from deploykit.render.common import RenderError
    from deploykit.render.systemd import SystemdOptions, unit_name
    from deploykit.render.systemd import render_systemd as render
    from deploykit.render.unit_gpus import overlapping_units, parse_gpus

    target = (prefix or Path(sys.prefix)).absolute()
    try:
        chosen = parse_gpus(gpus)
    except RenderError as exc:
        fail(f"render systemd: {exc}")

    def render_units(plan: Plan, loaded: LoadedProfile) -> RenderResult:
        result = render(plan, loaded, SystemdOptions(prefix=target, gpus=chosen))
        opened = result.gpus if result.gpus is not None else []
        result.warnings += overlapping_units(out, unit_name(loaded), opened)
        return result

    _render("systemd", profile, out, facts, fix, render_units, force)


@render_app.command("helm")
def render_helm(
    profile: ProfileOption,
    out: OutOption,
    facts: FactsOption = None,
    fix: FixOption = None,
    force: ForceOption = False,
    kube_version: Annotated[
        str | None,
        typer.Option(
            "--kube-version",
            metavar="1.N",
            help="The cluster's Kubernetes (MAJOR.MINOR): the Pod Security and image-volume warnings are "
            "judged for it (default: 1.28, the oldest the chart supports).",
        ),
    ] = None,
) -> None:
    """A Helm chart (apiVersion v2): Deployment, Service, profile ConfigMap and a smoke test hook."""
    from deploykit.cli.options import fail
    from deploykit.render.helm import render_helm as render
    from deploykit.render.pod_security import OLDEST_KUBERNETES, parse_kube_version

    try:
        target = OLDEST_KUBERNETES if kube_version is None else parse_kube_version(kube_version)
    except ValueError as exc:
        fail(f"render helm: {exc}")

    def render_chart(plan: Plan, loaded: LoadedProfile) -> RenderResult:
        return render(plan, loaded, target)

    _render("helm", profile, out, facts, fix, render_chart, force)


def register(app: typer.Typer) -> None:
    """Add the render commands to the app."""
    app.add_typer(render_app, name="render")


@render_app.command("probe-job")
def render_probe_job(
    out: OutOption,
    image: Annotated[str, typer.Option(help="The vLLM image to run, tagged: the facts name its vLLM.")],
    node: Annotated[str | None, typer.Option(help="The node to probe (default: any).")] = None,
    node_selector: Annotated[
        list[str] | None, typer.Option(metavar="KEY=VALUE", help="Nodes with this label only.")
    ] = None,
    gpus: Annotated[int, typer.Option(help="GPUs to ask for: the pod sees only those.")] = 1,
    name: Annotated[str | None, typer.Option(help="The Job's name.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite a changed file in --out.")] = False,
) -> None:
    """A Job that runs `deploykit probe` on a GPU node: its log is the facts (docs/probe.md)."""
    from deploykit.cli.options import fail
    from deploykit.render.common import RenderError, write_files
    from deploykit.render.probe_job import probe_job
    from deploykit.render.probe_job import render_probe_job as render

    try:
        job = probe_job(image, gpus=gpus, node=node, node_selector=node_selector, name=name)
        done = write_files(render(job), out, force=force)
    except RenderError as exc:
        fail(f"render probe-job: {exc}")
    for path in done.written:
        typer.echo(str(path))
