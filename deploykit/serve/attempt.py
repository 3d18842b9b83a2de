"""`deploykit serve`: profile → probe → plan → a running vLLM → smoke verdict → one stored row.

Every attempt ends in exactly one row in the results store, including the ones that fail before the
server came up. vLLM runs in its own process group; deploykit forwards SIGINT/SIGTERM to the whole
group and waits until it is gone, so no vLLM process outlives the command. The stages themselves are
serve/stages.py's; after a passing verdict serving mode (serve/watch.py) takes over.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING

from deploykit import net
from deploykit.argv import value_or, with_port
from deploykit.errors import LaunchError
from deploykit.paths import default_log_dir
from deploykit.serve.console import ConsoleUI, LogFollower
from deploykit.serve.driver import Stage, exit_code, finish
from deploykit.serve.helpers import redact, secret_values
from deploykit.serve.options import ServeOptions as ServeOptions
from deploykit.serve.signals import forwarded_signals
from deploykit.serve.stages import (
    Attempt,
    ListenAddress,
    StageFailure,
    attempt_record,
    check_launchable,
    check_listen_addresses,
    check_plan,
    ensure_model,
    launch_environment,
    load,
    probe_machine,
    run_to_verdict,
    smoke_attempt,
    start_vllm,
    wait_healthy,
)
from deploykit.serve.watch import serve_foreground

if TYPE_CHECKING:
    from deploykit.results.store import Store
    from deploykit.smoke import SmokeReport


def run_serve(options: ServeOptions, ui: ConsoleUI | None = None) -> int:
    """One whole attempt; returns the process exit code. Stores exactly one row whatever happens."""
    import socket

    from deploykit.results.stores import open_store

    ui = ui or ConsoleUI(options.quiet)
    store = open_store(options.store_url)  # fails fast, before a model loads
    try:
        store.check_fits(hostname=socket.gethostname())  # what the row holds, before any work
        return _run_attempt(options, ui, store)
    finally:
        store.close()


def _run_attempt(options: ServeOptions, ui: ConsoleUI, store: Store) -> int:
    attempt = Attempt(options=options)
    with forwarded_signals() as gate:

        def stages() -> SmokeReport:
            _prepare_and_launch(attempt, ui)
            return smoke_attempt(attempt, ui)

        try:
            outcome = run_to_verdict(attempt, stages, gate=gate)
        finally:
            gate.armed = False
            ui.end_progress()
        keep_serving = outcome.verdict == "pass" and options.serving and gate.received is None
        if attempt.server is not None and not keep_serving:
            _stop(attempt, ui)
        record = attempt_record(attempt, outcome.verdict, outcome.diagnosis)
        finish(record, store, ui.say, ui.warn)
        store.close()
        if keep_serving and attempt.server is not None:
            return serve_foreground(attempt, gate, ui)
        return exit_code(record, outcome, gate)


def _prepare_and_launch(attempt: Attempt, ui: ConsoleUI) -> None:
    from deploykit.plan import make_plan, unauthenticated_exposure

    options = attempt.options
    attempt.loaded = load(options.profile)
    profile = attempt.loaded.profile

    attempt.enter(Stage.PROBE)
    facts, attempt.versions = probe_machine()
    attempt.facts = facts.model_dump(mode="json")

    attempt.enter(Stage.PLAN)
    plan = make_plan(attempt.loaded, facts, options.overrides)
    attempt.plan = plan
    attempt.secrets = secret_values(plan, os.environ)
    argv = plan.argv if options.port is None else with_port(plan.argv, options.port)
    attempt.argv = argv
    check_plan(plan)
    check_launchable(plan)  # a plan refusal (exit 2) at the `plan` stage; the row is stored as for any stage
    exposure = unauthenticated_exposure(profile)
    if exposure:
        raise StageFailure(Stage.PLAN, f"refused: {exposure}")
    for warning in plan.warnings:
        ui.warn(warning)
    host = value_or(argv, "--host", "127.0.0.1")
    port = int(value_or(argv, "--port", "8000"))
    attempt.base_url = net.base_url(host, port)

    attempt.enter(Stage.PORT)
    check_listen_addresses(listen_addresses(options, host, port))

    attempt.enter(Stage.SECRETS)
    env = launch_environment(plan, os.environ)

    attempt.enter(Stage.MODEL)
    build_started = time.monotonic()
    ensure_model(plan, profile.model.source, ui.say)
    attempt.mark("model_build_s", build_started)

    attempt.enter(Stage.LAUNCH)
    log_dir = options.log_dir or default_log_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = log_dir / f"{profile.name}-{stamp}-{os.getpid()}.log"
    attempt.timings["before_launch_s"] = round(time.monotonic() - attempt.started, 4)
    attempt.server = start_vllm(argv, env, log_path=log_path, host=host, port=port)
    ui.say(f"vLLM started: pid {attempt.server.pid} (own process group), log {log_path}")
    _prewarm_imports()

    attempt.enter(Stage.STARTUP)
    follower = LogFollower(log_path)

    def echo_log() -> None:
        ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])

    def on_progress(elapsed: float, last_line: str) -> None:
        echo_log()
        ui.progress(elapsed, redact(last_line, attempt.secrets))

    try:
        startup = wait_healthy(attempt.server, profile.deploy.startup_timeout_s, on_progress)
    except LaunchError as exc:
        raise _with_known_hangs(exc, attempt) from None
    finally:
        ui.end_progress()
        echo_log()
    attempt.timings["startup_s"] = round(startup, 4)
    ui.say(f"vLLM healthy after {startup:.1f} s at {attempt.base_url}")


def _with_known_hangs(error: LaunchError, attempt: Attempt) -> LaunchError:
    """A start-up that timed out (vLLM alive, /health silent) names the hang advisories the plan matched
    and left open: some wedge before vLLM ever listens (a cross-node all-reduce set-up, a stale autotune
    cache)."""
    from deploykit.canary.known_hangs import hang_ids, hang_suffix, named_hangs

    if error.server_exit_code is not None or attempt.plan is None:
        return error
    suffix = hang_suffix(named_hangs(hang_ids(attempt.plan.advisories)))
    if not suffix:
        return error
    return LaunchError(f"{error}{suffix}", server_exit_code=None, log_tail=error.log_tail)


def listen_addresses(options: ServeOptions, host: str, port: int) -> list[ListenAddress]:
    """Every address this run will listen on: vLLM's, and in serving mode the canary's `--canary-listen`."""
    addresses = [ListenAddress("vLLM", host, port, "pass --port N")]
    if options.canary_listens:
        assert options.canary is not None
        canary_host, canary_port = options.canary.listen_address  # (checked when the settings were made)
        addresses.append(
            ListenAddress("the canary's /healthz", canary_host, canary_port, "pass --canary-listen HOST:PORT")
        )
    return addresses


def _prewarm_imports() -> None:
    """Import what the smoke and the store need while vLLM loads, so it is off the path to the verdict."""

    def work() -> None:
        import httpx  # noqa: F401

    threading.Thread(target=work, name="deploykit-prewarm", daemon=True).start()


def _stop(attempt: Attempt, ui: ConsoleUI) -> None:
    assert attempt.server is not None
    started = time.monotonic()
    code = attempt.server.stop()
    attempt.mark("stop_s", started)
    ui.say(f"vLLM stopped (exit code {code}); its process group is gone")
