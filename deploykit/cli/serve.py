"""`deploykit serve`, `deploykit smoke`, `deploykit results list|show`.

Nothing heavy at import time: the orchestration, the store (SQLAlchemy) and HTTP load inside commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from deploykit.canary import defaults as canary_defaults
from deploykit.canary.defaults import OnCorruption
from deploykit.canary.settings import DEFAULTS, MIN_EVERY_S, SETTINGS
from deploykit.cli.options import (
    ROW_ID,
    ROW_LIMIT,
    FactsOption,
    FixOption,
    FormatOption,
    ProfileOption,
    StoreOption,
    TableOrJson,
    WholeNumber,
    seconds,
    setting_parser,
)

if TYPE_CHECKING:
    from deploykit.results.record import ResultRecord


results_app = typer.Typer(help="Stored results of serve and smoke attempts.", no_args_is_help=True)


def serve(
    profile: ProfileOption,
    fix: FixOption = None,
    check: Annotated[
        bool, typer.Option("--check", help="Stop after the verdict: exit 0 when it passes, 1 when not.")
    ] = False,
    port: Annotated[
        int | None,
        typer.Option("--port", min=1, max=65535, help="Serve on this port (1-65535), not the profile's."),
    ] = None,
    store: StoreOption = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Stream vLLM's log here too (default: its file only).")
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="Keep vLLM's log in its file only (the default).")
    ] = False,
    log_dir: Annotated[
        Path | None, typer.Option("--log-dir", help="Where vLLM's log goes (default: user log dir).")
    ] = None,
    every_s: Annotated[
        float,
        typer.Option(
            str(SETTINGS["every_s"].serve_flag),
            parser=setting_parser(SETTINGS["every_s"], off=True),
            help=f"While serving, check the output with the canary every S seconds (at least "
            f"{MIN_EVERY_S:g}; 0: no canary).",
        ),
    ] = DEFAULTS.every_s,
    listen: Annotated[
        str | None,
        typer.Option(
            str(SETTINGS["listen"].serve_flag),
            help="HOST:PORT for the canary's /healthz and /metrics (default: off).",
        ),
    ] = None,
    on_corruption: Annotated[
        OnCorruption,
        typer.Option(
            "--on-corruption",
            help="When the canary sees wrong output: restart vLLM (backoff, a cap per hour, then stop), "
            "stop serving (exit 1), or ignore it (its row and /healthz still say so).",
        ),
    ] = canary_defaults.ON_CORRUPTION,
    max_restarts_per_hour: Annotated[
        int,
        typer.Option(
            "--max-restarts-per-hour",
            parser=WholeNumber(0, 1_000_000),
            help="Restarts on corruption allowed in any hour.",
        ),
    ] = canary_defaults.MAX_RESTARTS_PER_HOUR,
    restart_backoff: Annotated[
        float,
        typer.Option(
            "--restart-backoff",
            parser=seconds(0.0),
            help="Seconds before the 2nd restart in an hour (the 1st is at once), doubling after.",
        ),
    ] = canary_defaults.RESTART_BACKOFF_S,
) -> None:
    """Start vLLM for a profile, smoke it with token ids, store the result; then keep serving (or --check).

    While serving, an in-process canary checks the output every --canary-every seconds and acts on
    corruption (--on-corruption); slowness and timeouts are never corruption."""
    from deploykit.canary.settings import SERVE_FLAGS, check_settings
    from deploykit.cli.options import fail, parse_fix_overrides
    from deploykit.errors import CanaryError
    from deploykit.serve.attempt import ServeOptions, run_serve

    # The canary's settings, checked as `deploykit canary --every/--listen` are (one declaration, one
    # parser); `--canary-every 0`: no canary, `--canary-listen` left out: no listener.
    given = {"every_s": every_s or DEFAULTS.every_s, "listen": DEFAULTS.listen if listen is None else listen}
    try:
        settings = check_settings(SERVE_FLAGS, **given)
    except CanaryError as exc:
        fail(f"serve: {exc}")
    options = ServeOptions(
        profile=profile,
        overrides=parse_fix_overrides(fix),
        check=check,
        port=port,
        store_url=store,
        quiet=quiet or not verbose,
        log_dir=log_dir,
        canary=settings if every_s > 0 else None,
        canary_http=listen is not None,
        on_corruption=on_corruption,
        max_restarts_per_hour=max_restarts_per_hour,
        restart_backoff_s=restart_backoff,
    )
    raise typer.Exit(run_serve(options))


def smoke(
    url: Annotated[str, typer.Option("--url", help="The server's base URL, e.g. http://127.0.0.1:8000")],
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help="Take the cases and served name from a profile.")
    ] = None,
    model: Annotated[
        str | None, typer.Option("--model", help="The served model name (completion + chat cases).")
    ] = None,
    api_key_env: Annotated[
        str | None,
        typer.Option(
            "--api-key-env", help="Environment variable holding the API key (default: the profile's)."
        ),
    ] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", help="Seconds per request.")] = None,
    store: StoreOption = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Do not record this attempt.")] = False,
    expect_fixes: Annotated[
        str | None,
        typer.Option(
            "--expect-fixes",
            metavar="NAME[,NAME]",
            help="Fixes that must be active on the server (GET /deploykit/status), or `none` "
            "(default: the fixes the plan of --profile enables on --facts, else none).",
        ),
    ] = None,
    facts: FactsOption = None,
) -> None:
    """Run the smoke cases against a server that is already running (local or remote), and check that
    the planned fixes are active on it."""
    from deploykit.cli.options import fail
    from deploykit.serve.remote_smoke import SmokeOptions, run_remote_smoke

    if profile is None and model is None:
        fail("smoke: give --profile P or --model NAME")
    if timeout is not None and not timeout > 0:  # also refuses nan
        fail(f"smoke: --timeout {timeout}: must be a positive number of seconds per request")
    check_url(url)
    expected = None
    if expect_fixes is not None:
        from deploykit.plan import FIX_NAMES
        from deploykit.smoke.fix_check import parse_expect_fixes

        try:
            expected = parse_expect_fixes(expect_fixes, FIX_NAMES)
        except ValueError as exc:
            fail(f"smoke: {exc}")
    options = SmokeOptions(
        url=url,
        profile=profile,
        model=model,
        api_key_env=api_key_env,
        timeout_s=timeout,
        store_url=store,
        store=not no_store,
        expect_fixes=expected,
        facts=str(facts) if facts is not None else None,
    )
    raise typer.Exit(run_remote_smoke(options))


@results_app.command("list")
def results_list(
    store: StoreOption = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", parser=ROW_LIMIT, help="How many, newest first.")
    ] = 20,
    profile: Annotated[str | None, typer.Option("--profile", help="Only this profile name.")] = None,
    format: FormatOption = TableOrJson.table,
) -> None:
    """The newest attempts, one line each."""
    from deploykit.results.stores import opened_store

    with opened_store(store) as opened:
        records = opened.recent(limit=limit, profile=profile)
        where = opened.display_url
        if opened.replayed:
            typer.echo(f"deploykit: {opened.replayed} spooled row(s) written to {where} first", err=True)
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps([r.model_dump(mode="json") for r in records], indent=2))
        return
    from rich.table import Table

    from deploykit.cli.report import is_terminal, output_console

    width = 70 if is_terminal() else None  # whole diagnoses when the output is not a terminal
    table = Table(title=f"results in {where}")
    for column in ("id", "when (UTC)", "command", "profile", "verdict", "stage", "start-up", "diagnosis"):
        table.add_column(column, no_wrap=column in ("id", "verdict"))
    for record in records:
        table.add_row(
            str(record.id),
            record.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            record.command,
            record.profile_name or "-",
            record.verdict,
            record.stage,
            _seconds(record.timings.get("startup_s")),
            _shorten(record.diagnosis.split("\n", 1)[0], width),
        )
    output_console().print(table)


@results_app.command("show")
def results_show(
    result_id: Annotated[
        int, typer.Argument(metavar="ID", parser=ROW_ID, help="A result id from `results list`.")
    ],
    store: StoreOption = None,
    format: FormatOption = TableOrJson.table,
) -> None:
    """Everything stored about one attempt."""
    from deploykit.results.stores import opened_store

    with opened_store(store) as opened:
        record = opened.get(result_id)
    if record is None:
        from deploykit import exit_codes

        typer.echo(f"deploykit results show: no result #{result_id}", err=True)
        raise typer.Exit(exit_codes.FAILED)
    if format is TableOrJson.json:
        import json

        # json.dumps, not pydantic's JSON: every character a terminal acts on (C1, bidi) comes out escaped.
        typer.echo(json.dumps(record.model_dump(mode="json"), indent=2))
        return
    _print_record(record)


def _print_record(record: ResultRecord) -> None:
    from rich.table import Table

    from deploykit.cli.report import output_console

    console = output_console(highlight=False)
    console.print(f"result #{record.id}  {record.created_at:%Y-%m-%d %H:%M:%S} UTC  on {record.hostname}")
    console.print(
        f"command {record.command}  profile {record.profile_name or '-'}  ({record.profile_id or '-'})"
    )
    console.print(f"verdict {record.verdict.upper()} at stage {record.stage}: {record.diagnosis}")
    console.print("versions " + "  ".join(f"{k} {v or '-'}" for k, v in record.versions.items()))
    if record.plan:
        import shlex

        console.print("argv " + shlex.join(record.plan.get("argv", [])))
        env = record.plan.get("env") or {}
        if env:
            console.print("env " + " ".join(f"{k}={v}" for k, v in env.items()))
    console.print("timings " + "  ".join(f"{k} {v}" for k, v in record.timings.items()))
    if record.fixes_active is not None:
        active = ", ".join(f"{name} ({target})" for name, target in record.fixes_active.items())
        console.print(f"fixes active on the server: {active or 'none'}")
    if record.cases:
        table = Table("case", "model", "ok", "latency", "tok/s", "finish", "first ids", "diagnosis")
        for case in record.cases:
            table.add_row(
                case.name,
                case.model,
                "yes" if case.passed else "NO",
                f"{case.latency_s:.2f} s",
                f"{case.tokens_per_s:.1f}" if case.tokens_per_s else "-",
                case.finish_reason or "-",
                " ".join(str(i) for i in case.first_ids[:12]),
                case.diagnosis or "",
            )
        console.print(table)
    if record.log_path:
        console.print(f"log {record.log_path}")
    if record.log_tail:
        console.print("--- log tail ---")
        console.print("\n".join(record.log_tail.split("\n")[-20:]))


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _shorten(text: str, width: int | None) -> str:
    """One line, cut to `width`: its characters a terminal acts on escaped first, so none is dropped."""
    from deploykit.untrusted_text import terminal_text

    text = " ".join(terminal_text(text).split())
    return text if width is None or len(text) <= width else text[: width - 1] + "…"


def check_url(url: str) -> None:
    """`--url` must be an http(s) URL with a host and, when it names one, a port in 1-65535."""
    from urllib.parse import urlsplit

    from deploykit.cli.options import fail
    from deploykit.net import redact_url

    shown = redact_url(url)  # a `user:pw@` in the URL is never echoed

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        fail(f"smoke: --url {shown!r}: {exc} (ports are 1-65535)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(f"smoke: --url {shown!r}: expected http://HOST:PORT, e.g. http://127.0.0.1:8000")
    if port == 0:
        fail(f"smoke: --url {shown!r}: port 0 is not a port a server listens on (ports are 1-65535)")


def register(app: typer.Typer) -> None:
    """Add the serving commands to the app."""
    app.command()(serve)
    app.command()(smoke)
    from deploykit.cli.baseline import baseline_app

    results_app.add_typer(baseline_app, name="baseline")
    app.add_typer(results_app, name="results")
