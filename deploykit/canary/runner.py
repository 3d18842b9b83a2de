"""`Canary`: what one canary knows and does — a run (the rotation's next case, judged with the smoke rules),
a page of the server's /metrics (its NaN counter, its progress), the state they move (one `_transition`
for every change: the state, its metrics, its row, its verdict file), its rows and its verdict. It starts
no thread: `runtime.CanaryRuntime` owns the threads that call it, for `deploykit canary` and for serve's
in-process canary alike.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deploykit.canary import defaults
from deploykit.canary.known_hangs import hang_suffix
from deploykit.canary.metrics import CanaryMetrics
from deploykit.canary.nan_counter import NanCounterFollower
from deploykit.canary.progress import ProgressReading, ProgressWatch, hung_diagnosis
from deploykit.canary.rotation import case_labels, run_requests
from deploykit.canary.settings import DEFAULTS, CanarySettings
from deploykit.canary.state import CanaryState, Outcome, Status, outcome_of
from deploykit.canary.verdict import write_or_warn
from deploykit.endpoint import Endpoint

if TYPE_CHECKING:
    from deploykit.canary.nan_counter import CounterReading
    from deploykit.canary.server_page import ServerPage
    from deploykit.fleet_baseline import FingerprintCheck
    from deploykit.profile.schema import SmokeCase
    from deploykit.results.record import ResultRecord
    from deploykit.smoke import SmokeReport, SmokeRequest
    from deploykit.smoke.fingerprint import Fingerprint

Runner = Callable[..., "SmokeReport"]


@dataclass
class CanaryConfig:
    """What a canary checks, how often, and where its rows and verdict go."""

    endpoint: Endpoint
    """The server: its URL, its key, and the deadlines of a request (the settings' `timeout_s`, set here)
    and of a /metrics read."""
    served_name: str
    cases: list[SmokeCase]
    settings: CanarySettings = DEFAULTS
    """Interval, timeout, NaN-counter reads, miss limit, listen address (`settings.CanarySettings`)."""
    special_ids: frozenset[int] = frozenset()
    vocab_size: int | None = None
    """Every generated id must be below it (the model's config.json); None: vLLM's int32 bound."""
    max_model_len: int | None = None
    tie_tolerance: float = 0.05
    logprob_tolerance: float = 0.05
    heartbeat_s: float = defaults.HEARTBEAT_S
    store_url: str | None = None
    store: bool = True
    profile_name: str | None = None
    profile_id: str | None = None
    adapter: str | None = None
    verdict_file: str | None = None
    fingerprint: FingerprintCheck | None = None
    """Compare the probe set's answers with the key's baseline on every run that otherwise passed."""
    hung_after_s: float = defaults.HUNG_AFTER_S
    """Requests waiting this long with no token produced make the verdict `hung` (`progress`); 0: never."""
    progress_every_s: float = defaults.PROGRESS_EVERY_S
    """Seconds between reads of vLLM's token counters for `hung_after_s`."""
    known_hangs: tuple[str, ...] = ()
    """The hang advisories the deployment's plan matched (`known_hangs.named_hangs`): a `hung` verdict
    names them."""
    api_key_file: str | None = None
    """Read the API key from this file before every run (a mounted Secret the kubelet updates), so a key
    rotated under a running canary is picked up without a restart."""
    keep_running: bool = False
    """Configuration errors and the canary's own failures are a `misconfigured` verdict, never the end of
    the loop (`loop`): the chart's and the units' canary."""
    identify: bool = False
    """Look first whether the URL is vLLM serving `served_name` (`discovery.identify`), until it answers:
    `deploykit canary` does, for a URL a person typed; serve's in-process canary knows its server."""

    def __post_init__(self) -> None:
        # Seconds per request: the settings' `timeout_s` (the profile's smoke timeout where the settings said
        # none), else `defaults.REQUEST_TIMEOUT_S`; a /metrics read: `defaults.METRICS_TIMEOUT_S`.
        self.endpoint = Endpoint(
            self.endpoint.url,
            self.endpoint.api_key,
            request_deadline_s=self.settings.timeout_s or defaults.REQUEST_TIMEOUT_S,
            metrics_deadline_s=defaults.METRICS_TIMEOUT_S,
        )

    @property
    def request_timeout_s(self) -> float:
        return self.endpoint.request_deadline_s

    @property
    def reads_page(self) -> bool:
        """Whether the server's /metrics is read at all: for the NaN counter, or for the hung judgement."""
        return self.settings.metrics_every_s > 0 or self.hung_after_s > 0

    @property
    def page_every_s(self) -> float:
        """One read per tick feeds every reader: as often as the most frequent of them needs."""
        wanted = [self.settings.metrics_every_s] if self.settings.metrics_every_s > 0 else []
        wanted += [self.progress_every_s] if self.hung_after_s > 0 else []
        return min(wanted) if wanted else self.progress_every_s

    @property
    def progress_window_s(self) -> float:
        """Counters seen advancing this recently make a miss streak `saturated`, not `unreachable`."""
        return self.hung_after_s if self.hung_after_s > 0 else defaults.HUNG_AFTER_S


@dataclass
class RunSummary:
    number: int
    case: str
    outcome: Outcome
    report: SmokeReport
    changed: Status | None
    stored: str | None = None


@dataclass
class LiveNanSummary:
    """vLLM's NaN counter grew: by how much, its value now, the state it moved, and the row stored."""

    grown: float
    total: float
    changed: Status | None
    stored: str | None = None


@dataclass
class Canary:
    config: CanaryConfig
    clock: Callable[[], float] = time.time
    runner: Runner | None = None
    on_run: Callable[[RunSummary], None] | None = None
    on_warning: Callable[[str], None] | None = None
    on_live_nan: Callable[[LiveNanSummary], None] | None = None
    on_hung: Callable[[str], None] | None = None
    """Called with the diagnosis when the verdict turns `hung`."""
    metrics: CanaryMetrics = field(default_factory=CanaryMetrics)
    state: CanaryState = field(init=False)
    runs: int = 0
    last_row_at: float | None = None
    rows: list[ResultRecord] = field(default_factory=list)
    identified: bool = False
    last_fingerprint: Fingerprint | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Serialises verdict writes (the run loop and the page reader): a snapshot taken earlier never replaces
    # a later one.
    _verdict_lock: threading.Lock = field(default_factory=threading.Lock)
    _verdict_error: str | None = None
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Which canary process wrote a verdict (with its pid and the verdict's `sequence`)."""
    sequence: int = 0
    progress: ProgressWatch = field(default_factory=ProgressWatch)
    nan_follower: NanCounterFollower = field(default_factory=NanCounterFollower)
    _run_since: float | None = None
    """Monotonic start of the run in flight (None between runs)."""
    _run_deadline: float | None = None
    """When the run in flight is stuck: its requests' deadlines plus `defaults.RUN_GRACE_S`."""
    _waiting_since: float | None = None
    """Since when the canary's requests have gone unanswered (runs that hit their deadline in a row)."""
    _last_beat: float = field(default_factory=time.monotonic)
    """When a run last ended (or the canary was made): /livez fails when runs stop coming."""
    _final: str | None = None
    """Why the canary ended: its last verdict says so, and is never `healthy`."""
    _too_big_said: bool = False
    server_start: float | None = None
    """The server process's start time as its /metrics last said: a change is a restart (`take_page`)."""

    def __post_init__(self) -> None:
        self.labels = case_labels(self.config.cases)
        self.state = CanaryState(
            rotation_len=len(self.config.cases), miss_limit=self.config.settings.miss_limit
        )
        self.nan_follower.on_warning = self._warn
        self.metrics.every.set(self.config.settings.every_s)
        self.metrics.request_timeout.set(self.config.request_timeout_s)

    # --- one transition for every change -------------------------------------------------------------

    def _transition(
        self,
        change: Callable[[CanaryState], Status | None],
        *,
        report: SmokeReport | None = None,
        count: Callable[[CanaryState], None] | None = None,
        now: float | None = None,
    ) -> tuple[Status | None, str | None]:
        """Apply `change` to the state under the lock (with `count`, the metrics of what happened), set the
        verdict gauges, store a `state:<new>` row when the status changed (`report`, else one saying the
        diagnosis), and rewrite the verdict file. Returns the new status (None: unchanged) and where the
        row went."""
        from deploykit.smoke import SmokeReport

        moment = self.clock() if now is None else now
        with self._lock:
            changed = change(self.state)
            if count is not None:
                count(self.state)
            self.metrics.set_verdict(self.state)
            diagnosis = self.state.diagnosis
        stored = None
        if changed is not None:
            passed = changed in ("healthy", "starting") and report is None
            row = report or SmokeReport(passed=passed, diagnosis=diagnosis, cases=[])
            stored = self._store_row(f"state:{changed}", row, moment)
        self.write_verdict()
        return changed, stored

    # --- runs ----------------------------------------------------------------------------------------

    def requests_for_run(self, number: int) -> tuple[str, list[SmokeRequest]]:
        """Run `number` (from 0) checks the rotation's next case; its long prompts are salted by `number`."""
        config = self.config
        requests = run_requests(
            config.cases, number, config.served_name, config.adapter, config.max_model_len
        )
        return self.labels[number % len(config.cases)], requests

    def look_at_server(self) -> None:
        """With `config.identify`, until vLLM answered: is the URL vLLM serving `served_name`? Raises
        CanaryError when it is not; nothing answering yet (vLLM loading) is left to the runs' misses."""
        if self.config.identify and not self.identified:
            from deploykit.canary.discovery import identify

            self.identified = identify(self.config.endpoint, self.config.served_name)

    def run_once(self) -> RunSummary:
        """One run: the next case, judged; the state, metrics, rows and verdict file follow. Raises
        CanaryError when `config.identify` finds the URL is not the vLLM server it should be."""
        summary = self.run_cancellable(None)
        assert summary is not None  # only a cancelled run has none
        return summary

    def run_cancellable(self, cancel: threading.Event | None) -> RunSummary | None:
        """`run_once`, or None, changing nothing, when `cancel` was set before the answers came (the canary
        is stopping: what a stopped run saw is not judged)."""
        number = self.runs
        self.runs += 1
        label, requests = self.requests_for_run(number)
        started = time.monotonic()
        with self._lock:
            self._run_since = started
            self._run_deadline = (
                started + self.config.request_timeout_s * (len(requests) + 2) + defaults.RUN_GRACE_S
            )
            if self._waiting_since is None:
                self._waiting_since = started
        try:
            self.look_at_server()
            report = self._ask(requests)
        finally:
            with self._lock:
                if self._run_since == started:  # (an abandoned run ending late leaves a newer one alone)
                    self._run_since = self._run_deadline = None
                    self._last_beat = time.monotonic()
        if cancel is not None and cancel.is_set():
            return None
        outcome = outcome_of(report)
        ended = time.monotonic()
        took = ended - started
        now = self.clock()

        def observe(state: CanaryState) -> Status | None:
            # Only a request that waited out its whole deadline keeps counting toward `hung`.
            if outcome != "miss" or took < 0.9 * self.config.request_timeout_s:
                self._waiting_since = None
            progressing = self.progress.advanced_within(ended, self.config.progress_window_s)
            return state.observe(label, outcome, report.diagnosis, progressing=progressing)

        def count(state: CanaryState) -> None:
            self.metrics.count_run(state, label, outcome, report, now, took)

        heartbeat = self.last_row_at is not None and now - self.last_row_at >= self.config.heartbeat_s
        changed, stored = self._transition(observe, report=report, count=count, now=now)
        if changed is None and heartbeat:
            stored = self._store_row("heartbeat", report, now)
            self.write_verdict()
        summary = RunSummary(number, label, outcome, report, changed, stored)
        if self.on_run is not None:
            self.on_run(summary)
        return summary

    def _ask(self, requests: list[SmokeRequest]) -> SmokeReport:
        """The run's requests, judged by the smoke rules (and the fingerprint when they passed)."""
        from deploykit.smoke import run_smoke

        runner = self.runner or run_smoke
        report = runner(
            self.config.endpoint,
            requests,
            special_ids=self.config.special_ids,
            vocab_size=self.config.vocab_size,
            tie_tolerance=self.config.tie_tolerance,
            logprob_tolerance=self.config.logprob_tolerance,
        )
        if self.config.fingerprint is not None and report.passed:
            report = self._with_fingerprint(self.config.fingerprint, report)
        return report

    def _with_fingerprint(self, check: FingerprintCheck, report: SmokeReport) -> SmokeReport:
        """One reading of the probe set, compared with its key's baseline, as one more case."""
        from deploykit.fleet_baseline import fingerprint_case, with_case

        case, self.last_fingerprint = fingerprint_case(
            check, self.config.endpoint, self.config.served_name, readings=1
        )
        return with_case(report, case)

    # --- the server's /metrics page --------------------------------------------------------------------

    def take_page(self, page: ServerPage, now: float | None = None) -> None:
        """One read of the server's /metrics, for every reader: the NaN counter (with `metrics_every_s`)
        and the progress counters (with `hung_after_s`). A page that could not be read is no reading: the
        last good one stands (a slow /metrics under load must not restart the clock of a hang)."""
        if not page.read:
            if page.too_big and not self._too_big_said:
                self._too_big_said = True  # said once: the page is re-read every few seconds
                self._warn(f"{page.problem}: vLLM's counters are not read while the page is that big")
            return
        self.metrics.vllm_nan_read.set(self.clock())
        started = page.progress.started if page.progress is not None else None
        if started is not None:
            self.metrics.note_server_start(started)
            before, self.server_start = self.server_start, started
            if before is not None and started != before:
                # A new server process: what was seen of the last says nothing (its /health may never have
                # been seen away: a restart between two polls).
                self.server_restarted()
                self.warn("the server restarted (its process start time changed): the canary starts afresh")
        if self.config.settings.metrics_every_s > 0:
            self.metrics.vllm_nan_counter.set(-1 if page.nan is None else page.nan.total)
            grown = self.nan_follower.take(page.nan)
            if grown > 0 and page.nan is not None:
                self.live_nan(grown, page.nan)
        if self.config.hung_after_s > 0 or page.progress is not None:
            self.observe_progress(page.progress, now, paused=page.paused)

    def live_nan(self, grown: float, reading: CounterReading) -> LiveNanSummary:
        """vLLM counted `grown` more requests with NaN logits: corrupt at once (a row, the verdict file,
        `/healthz` 503), without waiting for the next run."""
        changed, stored = self._transition(
            lambda state: state.observe_live_nan(grown, reading.total),
            count=lambda state: self.metrics.live_nan.inc(grown),
        )
        summary = LiveNanSummary(grown, reading.total, changed, stored)
        if self.on_live_nan is not None:
            self.on_live_nan(summary)
        return summary

    def observe_progress(
        self, reading: ProgressReading | None, now: float | None = None, paused: bool = False
    ) -> Status | None:
        """Take one reading of the engine's progress (None: none could be made). The verdict turns `hung`
        once requests have waited `hung_after_s` with no work done (an engine asleep, paused or loading
        weights is quiet on purpose); a miss streak is `saturated` while work is done, `unreachable` when
        not. Returns the new status when it changed."""
        if reading is None:  # no reading: the last good one stands (the counters only grow in one process)
            return None
        moment = time.monotonic() if now is None else now
        quiet = paused or reading.quiet_on_purpose is not None
        with self._lock:
            advanced_before = self.progress.advanced_at
            self.progress.observe(reading, moment, quiet_on_purpose=quiet)
            waiting = self._waiting_since if self._run_since is not None else None
            stalled = self.progress.stalled_for(moment, waiting)
            progressing = self.progress.advanced_within(moment, self.config.progress_window_s)
            advanced = self.progress.advanced_at != advanced_before
        self.metrics.progress_tokens.set(reading.tokens)
        if advanced:
            self.metrics.progress_advanced.set(self.clock())
        hung_after = self.config.hung_after_s
        if stalled is not None and hung_after > 0 and stalled >= hung_after:
            diagnosis = hung_diagnosis(stalled, reading.tokens) + hang_suffix(self.config.known_hangs)
            changed, _ = self._transition(lambda state: state.observe_hung(diagnosis))
            if changed is not None and self.on_hung is not None:
                self.on_hung(self.state.diagnosis)
            return changed
        if self.state.status not in ("unreachable", "saturated"):
            return None
        changed, _ = self._transition(lambda state: state.observe_progressing(progressing))
        return changed

    # --- the canary's own health ----------------------------------------------------------------------

    def stuck(self, now: float | None = None, run_only: bool = False) -> str | None:
        """Why the canary's own runs have stopped advancing (a run past its deadlines, or, unless
        `run_only`, no run for longer than the interval allows), or None while they advance."""
        moment = time.monotonic() if now is None else now
        with self._lock:
            if self._run_deadline is not None and self._run_since is not None:
                if moment > self._run_deadline:
                    return f"the canary's run has not ended after {moment - self._run_since:.0f} s (stuck)"
                return None
            if run_only:
                return None
            quiet = moment - self._last_beat
        every_s = self.config.settings.every_s
        if quiet > every_s + self.config.request_timeout_s + defaults.RUN_GRACE_S:
            return f"no canary run for {quiet:.0f} s (runs every {every_s:g} s): the runs stopped"
        return None

    def liveness(self) -> tuple[bool, str]:
        """`/livez`: wrong on corruption, on a hung engine, when the canary's own runs stop advancing, or
        when the server's own /health does not answer (what a liveness probe on /health said before).
        Misses, saturation and slowness never make it fail."""
        from deploykit.canary.discovery import server_health_ok

        stuck = self.stuck()
        if stuck is not None:
            return False, stuck
        with self._lock:
            state = self.state
            if state.corrupt or state.hung:
                return False, f"{state.status}: {state.diagnosis}"
            text = f"{state.status}: {state.diagnosis}"
        if not server_health_ok(self.config.endpoint, defaults.LIVEZ_HEALTH_TIMEOUT_S):
            return False, f"the server's /health at {self.config.endpoint.shown} does not answer 200"
        return True, text

    def server_restarted(self) -> Status | None:
        """The server came back after going away (`runtime` watches its /health; serve restarts it)."""
        self.last_fingerprint = None  # the restarted server's answers are not known yet
        self.metrics.server_restarts.inc()

        def restart(state: CanaryState) -> Status | None:
            self.progress.forget()
            self._waiting_since = None
            changed = state.restarted()
            if changed is not None:
                self.metrics.misses.set(0)
            return changed

        from deploykit.smoke import SmokeReport

        changed, _ = self._transition(
            restart, report=SmokeReport(passed=True, diagnosis="restarted", cases=[])
        )
        return changed

    def engine_replaced(self) -> Status | None:
        """serve restarted vLLM itself: counted as a restart; a hang was the old engine's and is cleared,
        while corruption waits for a whole rotation of passes, as after any wrong answer."""
        changed = self.server_restarted() if self.state.hung else None  # (it counts the restart)
        if changed is None:
            self.metrics.server_restarts.inc()
        self.forget_progress()  # the new process's first start time is no second restart
        return changed

    def forget_progress(self) -> None:
        """The engine is another one now (serve restarted it): what was seen of the last says nothing."""
        with self._lock:
            self.progress.forget()
            self._waiting_since = None
            self.server_start = None  # the new process's start is its first, not a restart seen twice

    def misconfigured(self, diagnosis: str) -> Status | None:
        """The canary cannot judge for a reason of its own: a `misconfigured` verdict (never `healthy`,
        never a reason to restart vLLM), a row and a warning line when it changed or its reason did."""
        said = self.state.diagnosis if self.state.misconfigured else None
        changed, _ = self._transition(lambda state: state.observe_misconfigured(diagnosis))
        if self.state.misconfigured and diagnosis != said:
            self._warn(f"MISCONFIGURED: {diagnosis} (vLLM is left alone: this is no reason to restart it)")
        return changed

    def refresh_api_key(self) -> None:
        """With `api_key_file`, the key as the file says now (a CanaryError when it cannot be read)."""
        if self.config.api_key_file is not None:
            from deploykit.canary.api_key import read_api_key_file

            key = read_api_key_file(self.config.api_key_file)
            self.config.endpoint = self.config.endpoint.with_key(key)

    def abandon_run(self) -> None:
        """The run in flight is given up (the runtime's run loop): nothing waits on it any more."""
        with self._lock:
            self._run_since = self._run_deadline = self._waiting_since = None
            self._last_beat = time.monotonic()

    def health(self) -> tuple[bool, str]:
        """`/healthz`: 200 while the replica should take traffic (healthy, starting, saturated)."""
        with self._lock:
            state = self.state
            return state.ready, f"{state.status}: {state.diagnosis}"

    def _store_row(self, stage: str, report: SmokeReport, now: float) -> str | None:
        from deploykit.canary.rows import canary_record
        from deploykit.results.store_row import store_row

        self.last_row_at = now
        config = self.config
        record = canary_record(
            stage,
            self.state,
            report,
            now,
            url=config.endpoint.shown,
            every_s=config.settings.every_s,
            runs=self.runs,
            profile_name=config.profile_name,
            profile_id=config.profile_id,
            fingerprint=self.last_fingerprint if report.passed else None,
        )
        self.rows.append(record)
        if not config.store:
            return None
        row_id, where = store_row(record, config.store_url, self._warn, what="the canary row")
        return where if row_id is not None else None

    def verdict(self) -> dict[str, Any]:
        """What the verdict file says: the state now, when, and which canary run said it (`run_id`, `pid`,
        `sequence`). After `final_verdict`, `unknown` (unless corrupt or hung, which stay: they restart)."""
        with self._lock:
            status: str = self.state.status
            diagnosis = self.state.diagnosis
            if self._final is not None and status not in ("corrupt", "hung"):
                status, diagnosis = "unknown", self._final
        return {
            "status": status,
            "diagnosis": diagnosis,
            "written_at": self.clock(),
            "pid": os.getpid(),
            "run_id": self.run_id,
            "sequence": self.sequence,
            "runs": self.runs,
            "final": self._final is not None,
        }

    def final_verdict(self, why: str) -> None:
        """The canary ends (stopped, or crashed with `why`): its last verdict is never `healthy`."""
        self._final = why
        if self.state.status not in ("corrupt", "hung"):
            self.metrics.show_status("unknown")
        self.write_verdict()

    def write_verdict(self) -> None:
        """Write `verdict()` to the verdict file, if there is one. Rewritten after every run, changed or
        not, so that its mtime says the canary is alive. A failure is a warning (once per streak of
        failures), never the end of the checking."""
        path = self.config.verdict_file
        if path is None:
            return
        with self._verdict_lock:
            self.sequence += 1
            self._verdict_error = write_or_warn(path, self.verdict(), self._verdict_error, self._warn)

    def warn(self, message: str) -> None:
        if self.on_warning is not None:
            self.on_warning(message)

    _warn = warn
