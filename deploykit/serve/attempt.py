"""`deploykit serve`: profile → probe → plan → a running vLLM → smoke verdict → one stored row.

Every attempt ends in exactly one row in the results store, including the ones that fail before the
server came up. vLLM runs in its own process group; deploykit forwards SIGINT/SIGTERM to the whole
group and waits until it is gone, so no vLLM process outlives the command.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from deploykit import net
from deploykit.paths import default_cache_dir, default_log_dir
from deploykit.profile.schema import FixMode
from deploykit.serve.console import ConsoleUI, LogFollower
from deploykit.serve.helpers import (
    ServeFailure,
    argv_value,
    child_environment,
    deploykit_version,
    exit_code_for,
    open_results_store,
    overhead,
    plan_for_store,
    print_verdict,
    profile_issues,
    redact,
    resolve_executable,
    secret_values,
    store_record,
    with_port,
)
from deploykit.serve.signals import Interrupted, SignalGate, forwarded_signals
from deploykit.serve.watch import (
    DEFAULT_CANARY_EVERY_S,
    DEFAULT_MAX_RESTARTS_PER_HOUR,
    DEFAULT_RESTART_BACKOFF_S,
    OnCorruption,
)

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile
    from deploykit.serve.launch import ServerProcess
    from deploykit.smoke import SmokeReport
    from deploykit.store import ResultRecord, Store


class ServeOptions(BaseModel):
    """What the `serve` command was asked to do."""

    model_config = ConfigDict(extra="forbid")

    profile: str
    overrides: dict[str, FixMode] = Field(default_factory=dict)
    check: bool = False
    port: int | None = Field(default=None, ge=1, le=65535)
    store_url: str | None = None
    quiet: bool = False
    log_dir: Path | None = None
    # Serving mode only (not --check): the in-process canary and what to do on corruption (serve/watch.py).
    canary_every: float = Field(default=DEFAULT_CANARY_EVERY_S, ge=0)
    canary_listen: str | None = None
    on_corruption: OnCorruption = "restart"
    max_restarts_per_hour: int = Field(default=DEFAULT_MAX_RESTARTS_PER_HOUR, ge=0)
    restart_backoff_s: float = Field(default=DEFAULT_RESTART_BACKOFF_S, ge=0)


@dataclass
class Attempt:
    """Everything known about one attempt so far; becomes the stored row."""

    options: ServeOptions
    started: float = field(default_factory=time.monotonic)
    stage: str = "profile"
    loaded: LoadedProfile | None = None
    plan: Plan | None = None
    argv: list[str] = field(default_factory=list)
    server: ServerProcess | None = None
    base_url: str | None = None
    report: SmokeReport | None = None
    timings: dict[str, float | None] = field(default_factory=dict)
    facts: dict[str, Any] | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)
    fixes_active: dict[str, str] | None = None

    def mark(self, key: str, since: float) -> None:
        self.timings[key] = round(time.monotonic() - since, 4)


def run_serve(options: ServeOptions, ui: ConsoleUI | None = None) -> int:
    """One whole attempt; returns the process exit code. Stores exactly one row whatever happens."""
    ui = ui or ConsoleUI(options.quiet)
    store = open_results_store(options.store_url)  # fails fast, before a model loads
    try:
        return _run_attempt(options, ui, store)
    finally:
        store.close()


def _run_attempt(options: ServeOptions, ui: ConsoleUI, store: Store) -> int:
    attempt = Attempt(options=options)
    verdict, diagnosis = "error", ""
    with forwarded_signals() as gate:
        try:
            _prepare_and_launch(attempt, ui)
            report = smoke_attempt(attempt, ui)
            verdict, diagnosis = ("pass" if report.passed else "fail"), report.diagnosis
            attempt.stage = "done"
        except Interrupted as exc:
            verdict = "interrupted"
            diagnosis = f"stopped by {signal.Signals(exc.signum).name} during {attempt.stage}"
            attempt.timings["signal"] = exc.signum
        except ServeFailure as exc:
            attempt.stage = exc.stage
            diagnosis = str(exc)
        except Exception as exc:  # an unexpected error still gets its row
            diagnosis = f"{type(exc).__name__}: {exc}"
        finally:
            gate.armed = False
            ui.end_progress()
        keep_serving = verdict == "pass" and not options.check and gate.received is None
        if attempt.server is not None and not keep_serving:
            _stop(attempt, ui)
        record = attempt_record(attempt, verdict, diagnosis)
        result_id, where = store_record(record, store, ui)
        print_verdict(record, result_id, where, ui)
        store.close()
        if keep_serving and attempt.server is not None:
            return _serve_foreground(attempt, gate, ui)
        if gate.received is not None and verdict != "interrupted":
            return 128 + gate.received
        return exit_code_for(record)


def _prepare_and_launch(attempt: Attempt, ui: ConsoleUI) -> None:
    from deploykit.plan import make_plan, unauthenticated_exposure
    from deploykit.probe.load import probe
    from deploykit.profile.load import load_profile
    from deploykit.profile.schema import ProfileError
    from deploykit.serve.launch import LaunchError, start_server

    options = attempt.options
    try:
        attempt.loaded = load_profile(options.profile)
    except ProfileError as exc:
        raise ServeFailure("profile", f"the profile cannot be used: {profile_issues(exc)}") from None
    profile = attempt.loaded.profile

    attempt.stage = "probe"
    facts = probe()
    attempt.facts = facts.model_dump(mode="json")
    attempt.versions = {
        "deploykit": deploykit_version(),
        "vllm": facts.vllm_version,
        "torch": facts.torch_version,
    }

    attempt.stage = "plan"
    plan = make_plan(attempt.loaded, facts, options.overrides)
    attempt.plan = plan
    attempt.secrets = secret_values(plan, os.environ)
    argv = plan.argv if options.port is None else with_port(plan.argv, options.port)
    attempt.argv = argv
    if plan.errors:
        raise ServeFailure("plan", "the plan has errors: " + "; ".join(plan.errors))
    exposure = unauthenticated_exposure(profile)
    if exposure:
        raise ServeFailure("plan", f"refused: {exposure}")
    for warning in plan.warnings:
        ui.warn(warning)
    host = argv_value(argv, "--host", "127.0.0.1")
    port = int(argv_value(argv, "--port", "8000"))
    attempt.base_url = net.base_url(host, port)

    attempt.stage = "port"
    if net.port_in_use(port, host):
        raise ServeFailure(
            "port",
            f"port {port} on {host} is already in use; stop what listens there or pass --port N",
        )

    attempt.stage = "secrets"
    env = child_environment(plan, os.environ)

    attempt.stage = "model"
    build_started = time.monotonic()
    ensure_model(plan, profile.model.source, ui)
    attempt.mark("model_build_s", build_started)

    attempt.stage = "launch"
    log_dir = options.log_dir or default_log_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = log_dir / f"{profile.name}-{stamp}-{os.getpid()}.log"
    launch_argv = resolve_executable(argv)
    attempt.timings["before_launch_s"] = round(time.monotonic() - attempt.started, 4)
    try:
        attempt.server = start_server(launch_argv, env, log_path=log_path, host=host, port=port)
    except LaunchError as exc:
        raise ServeFailure("launch", str(exc)) from None
    ui.say(f"vLLM started: pid {attempt.server.pid} (own process group), log {log_path}")
    _prewarm_imports()

    attempt.stage = "startup"
    follower = LogFollower(log_path)

    def on_progress(elapsed: float, last_line: str) -> None:
        ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
        ui.progress(elapsed, redact(last_line, attempt.secrets))

    try:
        startup = attempt.server.wait_healthy(profile.deploy.startup_timeout_s, on_progress, poll_s=0.2)
    except LaunchError as exc:
        ui.end_progress()
        ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
        if exc.server_exit_code is not None:
            message = f"vLLM exited during start-up with code {exc.server_exit_code}"
        else:
            message = (
                f"vLLM did not become healthy within {profile.deploy.startup_timeout_s} s (start-up timeout)"
            )
        raise ServeFailure("startup", f"{message}; last log lines:\n{_short_tail(exc.log_tail)}") from None
    ui.end_progress()
    ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
    attempt.timings["startup_s"] = round(startup, 4)
    ui.say(f"vLLM healthy after {startup:.1f} s at {attempt.base_url}")


def _prewarm_imports() -> None:
    """Import what the smoke and the store need while vLLM loads, so it is off the path to the verdict."""

    def work() -> None:
        import httpx  # noqa: F401

        import deploykit.smoke
        import deploykit.store  # noqa: F401

    threading.Thread(target=work, name="deploykit-prewarm", daemon=True).start()


def _short_tail(tail: str, lines: int = 12) -> str:
    return "\n".join(tail.strip().splitlines()[-lines:])


def ensure_model(plan: Plan, source: str, ui: ConsoleUI) -> None:
    """Build the builtin tiny model on first use (cached); a missing local path is vLLM's to report."""
    from deploykit.profile.schema import BUILTIN_PREFIX
    from deploykit.tinymodel import build_tiny_model, is_built

    if not source.startswith(BUILTIN_PREFIX) or is_built(plan.model_path):
        return
    ui.say(f"building the tiny demo model locally (first use, cached in {default_cache_dir()}) ...")
    built = build_tiny_model()
    if str(built) != plan.model_path:
        raise ServeFailure(
            "model", f"the tiny model was built at {built}, but the plan expects {plan.model_path}"
        )


def smoke_attempt(attempt: Attempt, ui: ConsoleUI) -> SmokeReport:
    """The profile's smoke cases and the plan's fix check against the attempt's server."""
    from deploykit.fix_check import smoke_with_fix_check
    from deploykit.smoke import derive_cases, smoke_requests, special_token_ids

    assert attempt.loaded is not None and attempt.plan is not None and attempt.base_url is not None
    profile = attempt.loaded.profile
    attempt.stage = "smoke"
    adapters = list(profile.serve.lora.adapters)
    requests = smoke_requests(derive_cases(profile), profile.served_name, adapters[0] if adapters else None)
    api_key = os.environ.get(profile.serve.api_key_env) if profile.serve.api_key_env else None
    ui.say(f"smoke: {len(requests)} request(s) against {attempt.base_url}")
    report, status = smoke_with_fix_check(
        attempt.base_url,
        requests,
        expected=attempt.plan.enabled_fixes,
        timeout_s=profile.smoke.timeout_s,
        api_key=api_key,
        special_ids=special_token_ids(attempt.plan.model_path),
        tie_tolerance=profile.smoke.tie_tolerance,
        logprob_tolerance=profile.smoke.logprob_tolerance,
        on_case=ui.case,
    )
    attempt.fixes_active = status.fixes_active
    attempt.report = report
    attempt.timings["smoke_s"] = round(report.elapsed_s, 4)
    attempt.timings["requests_s"] = round(sum(case.latency_s for case in report.cases), 4)
    for case in report.cases:
        attempt.timings[f"case_{case.name}_s"] = case.latency_s
    return report


def _stop(attempt: Attempt, ui: ConsoleUI) -> None:
    assert attempt.server is not None
    started = time.monotonic()
    code = attempt.server.stop()
    attempt.mark("stop_s", started)
    ui.say(f"vLLM stopped (exit code {code}); its process group is gone")


def attempt_record(attempt: Attempt, verdict: str, diagnosis: str) -> ResultRecord:
    """The attempt as its stored row."""
    from deploykit.store import ResultRecord

    attempt.mark("total_s", attempt.started)
    attempt.timings["overhead_s"] = round(overhead(attempt.timings), 4)
    # CPU this process used since it started (imports included, vLLM's processes not): load-proof overhead.
    attempt.timings["deploykit_cpu_s"] = round(time.process_time(), 4)
    loaded, plan = attempt.loaded, attempt.plan
    log_tail = attempt.server.log_tail(60) if attempt.server is not None else ""
    record = ResultRecord(
        command="serve",
        profile_name=loaded.profile.name if loaded else attempt.options.profile,
        profile_id=loaded.id if loaded else None,
        verdict=verdict,
        stage=attempt.stage,
        diagnosis=redact(diagnosis, attempt.secrets),
        base_url=attempt.base_url,
        facts=attempt.facts,
        plan=plan_for_store(plan, attempt.argv) if plan else None,
        versions=attempt.versions or {"deploykit": deploykit_version()},
        timings=attempt.timings,
        cases=attempt.report.cases if attempt.report else [],
        fixes_active=attempt.fixes_active,
        log_path=str(attempt.server.log_path) if attempt.server else None,
        log_tail=redact(log_tail, attempt.secrets),
    )
    return record


def _serve_foreground(attempt: Attempt, gate: SignalGate, ui: ConsoleUI) -> int:
    """Keep serving until SIGINT/SIGTERM, until vLLM exits, or until corruption stops it (serve/watch.py)."""
    from deploykit.serve.watch import serve_foreground

    return serve_foreground(attempt, gate, ui)
