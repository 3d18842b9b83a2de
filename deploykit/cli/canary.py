"""`deploykit canary`: check a running server's output forever; `/healthz` and `/metrics` for probes."""

from __future__ import annotations

from typing import Annotated

import typer

from deploykit import exit_codes
from deploykit.canary import defaults
from deploykit.canary.settings import DEFAULTS, MIN_EVERY_S, SETTINGS
from deploykit.cli.options import setting_parser

# The settings' options: their names, defaults and bounds are `CanarySettings`' (deploykit.canary.settings).
EVERY, METRICS_EVERY, LISTEN = SETTINGS["every_s"], SETTINGS["metrics_every_s"], SETTINGS["listen"]
TIMEOUT, MISS_LIMIT = SETTINGS["timeout_s"], SETTINGS["miss_limit"]


def canary(
    url: Annotated[str, typer.Option("--url", help="The server's base URL, e.g. http://127.0.0.1:8000")],
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help="Take the cases and served name from a profile.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option("--model", help="The served model name (default: the profile's, else the first)."),
    ] = None,
    every_s: Annotated[
        float,
        typer.Option(
            EVERY.flag,
            parser=setting_parser(EVERY),
            help=f"Seconds between runs (start to start), at least {MIN_EVERY_S:g}.",
        ),
    ] = DEFAULTS.every_s,
    metrics_every_s: Annotated[
        float,
        typer.Option(
            METRICS_EVERY.flag,
            parser=setting_parser(METRICS_EVERY),
            help="Seconds between reads of the server's /metrics for vLLM's NaN counter "
            "(vllm:corrupted_requests, on with VLLM_COMPUTE_NANS_IN_LOGITS=1): /healthz turns 503 as soon as "
            "it grows, between runs. 0: off.",
        ),
    ] = DEFAULTS.metrics_every_s,
    listen: Annotated[
        str, typer.Option(LISTEN.flag, help="HOST:PORT for /healthz (200 right, 503 wrong) and /metrics.")
    ] = DEFAULTS.listen,
    store: Annotated[
        str | None,
        typer.Option(
            "--store", help="Results store URL (default: $DEPLOYKIT_STORE, else SQLite in the user data dir)."
        ),
    ] = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Store no rows.")] = False,
    api_key_env: Annotated[
        str | None, typer.Option("--api-key-env", help="Environment variable holding the API key.")
    ] = None,
    api_key_file: Annotated[
        str | None,
        typer.Option(
            "--api-key-file",
            metavar="PATH",
            help="File holding the API key (a mounted Secret), read again before every run: a rotated key "
            "is picked up without a restart. Wins over --api-key-env.",
        ),
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            TIMEOUT.flag,
            parser=setting_parser(TIMEOUT),
            help=f"Seconds per request (default: the profile's, else {defaults.REQUEST_TIMEOUT_S:g}).",
        ),
    ] = DEFAULTS.timeout_s,
    miss_limit: Annotated[
        int,
        typer.Option(
            MISS_LIMIT.flag,
            parser=setting_parser(MISS_LIMIT),
            help="Runs in a row without an answer before /healthz says 503.",
        ),
    ] = DEFAULTS.miss_limit,
    exit_on_corruption: Annotated[
        bool,
        typer.Option(
            "--exit-on-corruption",
            help=f"Exit with code {exit_codes.CORRUPT} at the first wrong answer (never on slowness or "
            "misses): a supervisor such as the rendered systemd canary unit restarts the server on that "
            "code only.",
        ),
    ] = False,
    watch_restarts: Annotated[
        bool,
        typer.Option(
            "--watch-restarts/--no-watch-restarts",
            help=f"Poll the server's /health every {defaults.RESTART_POLL_S:g} s; when it comes back after "
            "going away (a restart), a corrupt or unreachable verdict is dropped and the canary starts "
            "afresh. Once the server's /metrics has shown its process start time, that decides instead "
            "(a /health slow under load is no restart).",
        ),
    ] = True,
    verdict_file: Annotated[
        str | None,
        typer.Option(
            "--verdict-file",
            metavar="PATH",
            help="Write the current verdict there as JSON (status, diagnosis, written_at, pid), atomically, "
            "at start, after every run and on a server restart: for the vLLM container's exec probes "
            "(python3 -m deploykit.render.pod_probe). A failed write is a warning, never a stop.",
        ),
    ] = None,
    keep_running: Annotated[
        bool,
        typer.Option(
            "--keep-running",
            help="Never end on the canary's own trouble: a key the server refuses, a served name or adapter "
            "it does not serve, a request it refuses as too long, a profile that cannot be read, a failure "
            "of the canary itself are a `misconfigured` verdict and a warning line, tried again every "
            "interval (never a reason to restart vLLM). The chart's and the units' canary run with it.",
        ),
    ] = False,
    known_hang: Annotated[
        list[str] | None,
        typer.Option(
            "--known-hang",
            metavar="ID",
            help="A hang advisory the deployment's plan matched (`deploykit advisories --kind hang`): a "
            "`hung` verdict names it. Repeat for several; the rendered chart and units pass the plan's.",
        ),
    ] = None,
) -> None:
    """Send a rotation of cheap smoke cases every S seconds; /healthz turns 503 once the output is wrong.

    /livez turns 503 only on corruption (or when the server's own /health does not answer): for liveness
    probes, which must never restart a server for being busy."""
    from deploykit.canary.command import CanaryOptions, run_canary
    from deploykit.canary.settings import check_settings

    settings = check_settings(  # a CanaryError, one line naming the option, before anything starts
        every_s=every_s,
        timeout_s=timeout_s,
        metrics_every_s=metrics_every_s,
        miss_limit=miss_limit,
        listen=listen,
    )
    options = CanaryOptions(
        url=url,
        settings=settings,
        profile=profile,
        model=model,
        store_url=store,
        store=not no_store,
        api_key_env=api_key_env,
        exit_on_corruption=exit_on_corruption,
        watch_restarts=watch_restarts,
        verdict_file=verdict_file,
        api_key_file=api_key_file,
        keep_running=keep_running,
        known_hangs=tuple(known_hang or ()),
    )

    def say(line: str) -> None:
        typer.echo(line)

    def warn(line: str) -> None:
        typer.echo(line, err=True)

    raise typer.Exit(run_canary(options, say, warn))


def register(app: typer.Typer) -> None:
    """Add `deploykit canary` to the app."""
    app.command()(canary)
