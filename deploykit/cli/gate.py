"""`deploykit gate`: judge a candidate (another vLLM release, driver, dtype or fix set) against the baseline
before it rolls out (docs/gate.md). Nothing heavy at import time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from deploykit import exit_codes
from deploykit.cli.options import ROW_ID, FactsOption, FormatOption, ProfileOption, StoreOption, TableOrJson


def gate(
    profile: ProfileOption,
    url: Annotated[
        str | None, typer.Option("--url", help="The candidate: a running server's base URL.")
    ] = None,
    launch: Annotated[
        bool,
        typer.Option("--launch", help="The candidate: deploykit starts it (--candidate-profile/-python)."),
    ] = False,
    candidate_profile: Annotated[
        str | None,
        typer.Option(
            "--candidate-profile", help="The candidate's profile, running or launched (default: --profile)."
        ),
    ] = None,
    candidate_python: Annotated[
        Path | None,
        typer.Option(
            "--candidate-python", help="Another vLLM environment's python: its `vllm` serves the candidate."
        ),
    ] = None,
    baseline_url: Annotated[
        str | None,
        typer.Option("--baseline-url", help="The baseline: a running server, measured in this run."),
    ] = None,
    launch_baseline: Annotated[
        bool,
        typer.Option(
            "--launch-baseline", help="The baseline: deploykit starts --profile first, then stops it."
        ),
    ] = False,
    baseline_python: Annotated[
        Path | None,
        typer.Option("--baseline-python", help="Another vLLM environment's python for --launch-baseline."),
    ] = None,
    baseline_row: Annotated[
        int | None,
        typer.Option(
            "--baseline-row", metavar="ROW", parser=ROW_ID, help="The baseline: a stored row's answers."
        ),
    ] = None,
    facts: FactsOption = None,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="Environment variable holding the servers' API key.")
    ] = None,
    store: StoreOption = None,
    no_store: Annotated[
        bool, typer.Option("--no-store", help="Store no row (the baseline must be a server).")
    ] = False,
    no_load: Annotated[
        bool, typer.Option("--no-load", help="Judge the answers only: no load sample.")
    ] = False,
    adopt: Annotated[
        bool, typer.Option("--adopt", help="On promote, make the candidate its key's baseline in the store.")
    ] = False,
    accept_drift: Annotated[
        bool,
        typer.Option(
            "--accept-drift", help="With --adopt: adopt a drifted candidate whose other checks hold."
        ),
    ] = False,
    format: FormatOption = TableOrJson.table,
    report_file: Annotated[
        Path | None, typer.Option("--report-file", help="Also write the JSON report to this file.")
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option("--log-dir", help="Where launched servers' logs go (default: the user's log dir)."),
    ] = None,
) -> None:
    """Judge a candidate deployment against the baseline before it rolls out: promote, or hold (drift,
    slower, broken). Exit 0 promote, 6 hold: drift or slower, 1 hold: broken."""
    import sys

    from deploykit.gate.report import render
    from deploykit.gate.run import GateOptions, run_gate

    options = GateOptions(
        profile=profile,
        url=url,
        launch=launch,
        candidate_profile=candidate_profile,
        candidate_python=str(candidate_python) if candidate_python else None,
        baseline_url=baseline_url,
        launch_baseline=launch_baseline,
        baseline_python=str(baseline_python) if baseline_python else None,
        baseline_row=baseline_row,
        facts=str(facts) if facts else None,
        api_key_env=api_key_env,
        store_url=store,
        store=not no_store,
        load=not no_load,
        adopt=adopt,
        accept_drift=accept_drift,
        log_dir=str(log_dir) if log_dir else None,
    )

    def say(line: str) -> None:
        typer.echo(line, err=True)

    report = run_gate(options, say)
    document = report.model_dump_json(indent=2)
    if report_file is not None:
        from deploykit.files import replace_private

        try:
            replace_private(report_file, (document + "\n").encode(), mode=0o644)
        except OSError as exc:
            say(f"the report could not be written to {report_file}: {exc.strerror}")
    if format is TableOrJson.json:
        sys.stdout.write(document + "\n")
    else:
        typer.echo("\n".join(render(report)))
    if report.verdict == "promote":
        raise typer.Exit(exit_codes.OK)
    raise typer.Exit(exit_codes.FAILED if report.reason == "broken" else exit_codes.HOLD)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate)
