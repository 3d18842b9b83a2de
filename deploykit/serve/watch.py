"""`deploykit serve` after the verdict: keep serving, run the canary in-process, act on corruption.

Some corruption comes later (the LoRA field report: correct until one long prompt, then token 0 for good
with HTTP 200 and a healthy `/health`). While serving, the canary (`deploykit.canary`) checks the
output every `--canary-every` seconds. A run whose answers are *wrong* (NaN/inf, token 0 or specials, an
answer that changed at a clear margin) is corruption; timeouts, refused connections and HTTP 5xx/429 are
misses and never corruption (a busy server is not a broken one). A hung engine (requests waiting on it,
no token produced for `HUNG_AFTER_S`, while its `/health` may say 200 for hours) is acted on like
corruption: only a restart brings it back.

On corruption, `--on-corruption`:
- `restart` (default): stop vLLM at once (no more wrong answers served), wait the backoff (0 s for the
  first restart in an hour, then `restart_backoff_s`, doubling), start it again with the same argv and
  environment, smoke it like the first start, and resume the canary. At most `max_restarts_per_hour`
  restarts in any hour; the next corruption then stops serving (exit 1).
- `stop`: stop vLLM and exit 1.
- `ignore`: keep serving; the canary's row, `/healthz` (503) and `/metrics` still say it.

Rows, in order: the canary's `state:corrupt` row (command `canary`), then serve's `corruption` row (what
was decided: restart, stop, cap reached), then the restarted server's own smoke row (command `serve`,
stage `done`, `timings.restart` = its number), and later the canary's `state:healthy` once a whole
rotation has passed again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deploykit import exit_codes
from deploykit.argv import value_or
from deploykit.canary import defaults as canary_defaults
from deploykit.canary.defaults import OnCorruption as OnCorruption
from deploykit.logtail import tail
from deploykit.results.store_row import store_row
from deploykit.serve.console import ConsoleUI, LogFollower
from deploykit.serve.driver import Stage, finish
from deploykit.serve.helpers import redact
from deploykit.serve.signals import Interrupted, SignalGate, forwarded_signals
from deploykit.serve.stages import (
    Attempt,
    attempt_record,
    launch_environment,
    profile_endpoint,
    run_to_verdict,
    smoke_attempt,
    start_vllm,
    wait_healthy,
)

if TYPE_CHECKING:
    from deploykit.canary.runner import Canary, LiveNanSummary, RunSummary
    from deploykit.smoke import SmokeReport

MAX_RESTART_BACKOFF_S = 600.0
HOUR_S = canary_defaults.RESTART_WINDOW_S


@dataclass
class RestartBudget:
    """How many restarts are left this hour, and how long to wait before the next (pure: the caller's clock).

    The first restart in an hour starts at once; each further one waits `backoff_s`, doubled per restart
    already made in the last hour, up to `max_backoff_s`."""

    max_per_hour: int = canary_defaults.MAX_RESTARTS_PER_HOUR
    backoff_s: float = canary_defaults.RESTART_BACKOFF_S
    max_backoff_s: float = MAX_RESTART_BACKOFF_S
    history: list[float] = field(default_factory=list)

    def recent(self, now: float) -> int:
        return sum(1 for at in self.history if now - at < HOUR_S)

    def next_delay(self, now: float) -> float | None:
        """Seconds to wait before the next restart, or None once the hour's cap is reached."""
        made = self.recent(now)
        if made >= self.max_per_hour:
            return None
        if made == 0:
            return 0.0
        return float(min(self.max_backoff_s, self.backoff_s * 2 ** (made - 1)))

    def record(self, now: float) -> int:
        """Note a restart; returns how many were made in the last hour, this one included."""
        self.history = [at for at in self.history if now - at < HOUR_S] + [now]
        return len(self.history)


class CanaryWatch:
    """The in-process canary (its threads owned by a `CanaryRuntime`), and an event (`corrupt`) set by each
    run whose answers were wrong and when the engine is hung: both mean vLLM must be restarted or stopped."""

    def __init__(self, canary: Canary, ui: ConsoleUI, http: bool) -> None:
        from deploykit.canary.runtime import CanaryRuntime

        self.canary = canary
        self.ui = ui
        self.corrupt = threading.Event()
        canary.on_run = self._on_run
        canary.on_warning = lambda message: ui.warn(message)
        canary.on_live_nan = self._on_live_nan
        canary.on_hung = self._on_hung
        self.runtime = CanaryRuntime(
            canary, on_loop_error=lambda exc: ui.warn(f"the canary stopped: {type(exc).__name__}: {exc}")
        )
        if http:  # on the settings' `listen` address (`--canary-listen`), checked when they were made
            host, _ = canary.config.settings.listen_address
            bound = self.runtime.open_listener("--canary-listen")
            ui.say(f"canary: /healthz and /metrics on http://{host}:{bound}")

    def _on_run(self, summary: RunSummary) -> None:
        if summary.outcome == "wrong":
            self.ui.warn(f"canary run {summary.number + 1} {summary.case}: WRONG: {summary.report.diagnosis}")
            self.corrupt.set()
        elif summary.outcome == "miss":
            self.ui.say(f"canary run {summary.number + 1} {summary.case}: miss: {summary.report.diagnosis}")
        elif summary.outcome == "misconfigured":  # the canary's setup, not the server's output: no restart
            self.ui.warn(
                f"canary run {summary.number + 1} {summary.case}: MISCONFIGURED: {summary.report.diagnosis} "
                "(no reason to restart vLLM)"
            )
        if summary.changed is not None:
            healthy, text = self.canary.health()
            self.ui.say(f"canary state: {text} (/healthz {200 if healthy else 503})")

    def _on_live_nan(self, summary: LiveNanSummary) -> None:
        """vLLM counted NaN logits on a user request: corruption now, not at the next run."""
        self.ui.warn(
            f"canary: live traffic: WRONG: vLLM counted {summary.grown:g} more request(s) with NaN logits"
        )
        self.corrupt.set()

    def _on_hung(self, diagnosis: str) -> None:
        """No work done for the bound while requests wait: the engine is hung, whatever /health says."""
        self.ui.warn(f"canary: HUNG: {diagnosis}")
        self.corrupt.set()

    def problem(self) -> str:
        """What makes serve act, in words: `engine hung` or `output corrupt`, with the canary's diagnosis."""
        text = self.canary.health()[1]
        return f"engine hung: {text}" if self.canary.state.hung else f"output corrupt: {text}"

    def start(self, restarted: bool = False) -> None:
        """Start (or, after serve restarted vLLM, resume) the checking. A restart is the server coming
        back: the canary counts it, and a hang, which was the old engine's, is cleared (corruption waits
        for passes)."""
        if restarted:
            self.canary.engine_replaced()
        self.runtime.start()

    def pause(self) -> None:
        """Stop the checking threads (a run in flight is abandoned, not judged: the loop returns within a
        fraction of a second even when the run's request hangs); /healthz keeps answering."""
        self.runtime.pause()
        self.canary.forget_progress()  # the next server's engine is judged afresh
        self.corrupt.clear()

    def close(self) -> None:
        self.runtime.close()


def start_watch(attempt: Attempt, ui: ConsoleUI) -> CanaryWatch | None:
    """The in-process canary for a passing attempt, or None when `--canary-every 0`."""
    from deploykit.canary.config import config_for_profile
    from deploykit.canary.runner import Canary

    options = attempt.options
    if options.canary is None:
        return None
    assert attempt.loaded is not None and attempt.plan is not None and attempt.base_url is not None
    profile = attempt.loaded.profile
    config = config_for_profile(
        profile,
        attempt.loaded.id,
        endpoint=profile_endpoint(profile, attempt.base_url),
        model_path=attempt.plan.model_path,
        settings=options.canary,
        store_url=options.store_url,
    )
    config.fingerprint = attempt.fingerprint_check  # the start-up smoke's key: the canary compares alike
    from deploykit.canary.known_hangs import hang_ids, named_hangs

    config.known_hangs = named_hangs(hang_ids(attempt.plan.advisories))
    watch = CanaryWatch(Canary(config), ui, options.canary_http)
    ui.say(
        f"canary: every {config.settings.every_s:g} s, rotation {', '.join(watch.canary.labels)}; "
        f"on corruption: {options.on_corruption}"
    )
    return watch


def serve_foreground(attempt: Attempt, gate: SignalGate, ui: ConsoleUI) -> int:
    """Keep serving until SIGINT/SIGTERM (forwarded to vLLM's whole group), until vLLM exits, or until
    corruption makes it stop; restarts vLLM on corruption when told to."""
    assert attempt.server is not None and attempt.loaded is not None
    options = attempt.options
    budget = RestartBudget(options.max_restarts_per_hour, options.restart_backoff_s)
    served = attempt.loaded.profile.served_name
    watch = start_watch(attempt, ui)
    try:
        with forwarded_signals() as serving_gate:
            serving_gate.armed = False

            def signalled() -> int | None:
                return serving_gate.received or gate.received

            if watch is not None:
                watch.start()
            announced = None
            while True:
                server = attempt.server
                assert server is not None
                if server is not announced:
                    announced = server
                    ui.say(f"serving {served} at {attempt.base_url} (Ctrl-C or SIGTERM stops it)")
                _follow(attempt, ui, lambda: signalled() is not None or _corrupt(watch))
                code = server.exit_code()
                if signalled() is not None:
                    signum = signalled() or signal.SIGTERM
                    ui.say(f"{signal.Signals(signum).name} received: stopping vLLM ...")
                    server.stop()
                    ui.say("vLLM stopped; nothing left running")
                    return exit_codes.OK
                if code is not None:
                    last = tail(server.log_tail())
                    ui.warn(f"vLLM exited by itself with code {code}; last log lines:\n{last}")
                    server.stop()
                    return exit_codes.FAILED
                assert watch is not None
                watch.corrupt.clear()
                problem = watch.problem()
                if options.on_corruption == "ignore":
                    ui.warn(f"{problem}; serving on (--on-corruption ignore)")
                    continue
                delay = budget.next_delay(time.monotonic()) if options.on_corruption == "restart" else None
                if delay is None:
                    why = (
                        "--on-corruption stop"
                        if options.on_corruption == "stop"
                        else f"{options.max_restarts_per_hour} restart(s) in the last hour already, the cap"
                    )
                    watch.pause()
                    server.stop()
                    _store_decision(attempt, f"{problem}; vLLM stopped ({why})", ui)
                    ui.say("vLLM stopped; nothing left running")
                    return exit_codes.FAILED
                watch.pause()
                stopped_at = time.monotonic()
                server.stop()
                total = budget.record(time.monotonic())
                _store_decision(
                    attempt,
                    f"{problem}; vLLM stopped, restarting it after {delay:g} s "
                    f"(restart {total} of at most {options.max_restarts_per_hour} in an hour)",
                    ui,
                    restart=total,
                )
                if _wait(delay - (time.monotonic() - stopped_at), signalled):
                    continue  # the loop above sees the signal and stops (vLLM is already stopped)
                serving_gate.armed = True
                try:
                    attempt, passed = _relaunch(attempt, total, ui, serving_gate)
                except Interrupted as exc:  # _relaunch stopped what it started and stored its row
                    return exit_codes.for_signal(exc.signum)
                finally:
                    serving_gate.armed = False
                if attempt.server is None:  # it did not come up: its row says why
                    return exit_codes.FAILED
                if not passed:
                    watch.corrupt.set()  # the restarted server's smoke failed: corruption again
                    continue
                watch.start(restarted=True)
    finally:
        if watch is not None:
            watch.close()


def _corrupt(watch: CanaryWatch | None) -> bool:
    return watch is not None and watch.corrupt.is_set()


def _follow(attempt: Attempt, ui: ConsoleUI, done: Callable[[], bool]) -> None:
    """Echo vLLM's new log lines until `done()` or vLLM exits."""
    server = attempt.server
    assert server is not None
    follower = LogFollower(server.log_path)
    follower.offset = server.log_path.stat().st_size if server.log_path.exists() else 0
    while not done() and server.exit_code() is None:
        ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
        time.sleep(0.2)


def _wait(seconds: float, signalled: Callable[[], int | None]) -> bool:
    """Sleep up to `seconds`; True when a signal came meanwhile."""
    deadline = time.monotonic() + max(0.0, seconds)
    while time.monotonic() < deadline:
        if signalled() is not None:
            return True
        time.sleep(0.2)
    return signalled() is not None


def _store_decision(attempt: Attempt, diagnosis: str, ui: ConsoleUI, restart: int = 0) -> None:
    """serve's row for a corruption: what the canary saw and what serve did about it."""
    from deploykit.results.record import ResultRecord

    loaded = attempt.loaded
    assert loaded is not None
    record: ResultRecord = ResultRecord(
        command="serve",
        profile_name=loaded.profile.name,
        profile_id=loaded.id,
        verdict="fail",
        stage=Stage.CORRUPTION.value,
        diagnosis=redact(diagnosis, attempt.secrets),
        base_url=attempt.base_url,
        versions=attempt.versions,
        timings={"restart": float(restart), "serving_s": round(time.monotonic() - attempt.started, 4)},
        log_path=str(attempt.server.log_path) if attempt.server else None,
        log_tail=redact(attempt.server.log_tail(60), attempt.secrets) if attempt.server else "",
    )
    ui.warn(diagnosis)
    result_id, where = store_row(record, attempt.options.store_url, ui.warn)
    if result_id is not None:
        ui.say(f"result #{result_id} stored in {where}")


def _relaunch(previous: Attempt, number: int, ui: ConsoleUI, gate: SignalGate) -> tuple[Attempt, bool]:
    """Start vLLM again with the same argv and environment, wait for /health, smoke it, store its row.

    `gate` is armed by the caller: a signal until the verdict raises `Interrupted` here (the new vLLM is
    stopped, an `interrupted` row stored, and it is raised again); after the verdict it is only remembered.
    Returns the new attempt (its `server` is None when vLLM did not come up) and whether the smoke passed.
    """
    assert previous.loaded is not None and previous.plan is not None and previous.base_url is not None
    assert previous.server is not None
    attempt = Attempt(
        options=previous.options,
        stage=Stage.LAUNCH.value,
        loaded=previous.loaded,
        plan=previous.plan,
        argv=previous.argv,
        base_url=previous.base_url,
        facts=previous.facts,
        versions=previous.versions,
        secrets=previous.secrets,
    )
    attempt.timings["restart"] = float(number)
    profile = previous.loaded.profile
    log_path = previous.server.log_path.with_name(
        f"{profile.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-restart{number}.log"
    )
    plan = previous.plan

    def stages() -> SmokeReport:
        env = launch_environment(plan, os.environ)
        # The bind host from the argv, as at the first launch (the URL's `[::1]` is not a host).
        host = value_or(attempt.argv, "--host", "127.0.0.1")
        port = int(value_or(attempt.argv, "--port", "8000"))
        attempt.server = start_vllm(attempt.argv, env, log_path=log_path, host=host, port=port)
        ui.say(f"vLLM restarted: pid {attempt.server.pid} (own process group), log {log_path}")
        attempt.enter(Stage.STARTUP)
        startup = wait_healthy(attempt.server, profile.deploy.startup_timeout_s)
        attempt.timings["startup_s"] = round(startup, 4)
        ui.say(f"vLLM healthy again after {startup:.1f} s")
        return smoke_attempt(attempt, ui)

    outcome = run_to_verdict(attempt, stages, context=f" (restart {number})", gate=gate)  # disarms it
    record = attempt_record(attempt, outcome.verdict, outcome.diagnosis)
    if attempt.server is not None and (outcome.interrupted is not None or attempt.stage != Stage.DONE):
        attempt.server.stop()
        attempt.server = None
    finish(record, previous.options.store_url, ui.say, ui.warn)
    if outcome.interrupted is not None:
        raise outcome.interrupted
    return attempt, outcome.verdict == "pass"
