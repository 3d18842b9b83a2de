"""The canary's Prometheus series (`GET /metrics`), in a registry of their own: several canaries can live
in one process (tests, and serve's in-process canary beside a command's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploykit.canary.state import CanaryState, Outcome
    from deploykit.smoke import SmokeReport


class CanaryMetrics:
    """Gauges for the state now, counters for what the runs did."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.healthy = Gauge(
            "deploykit_canary_healthy",
            "1 while the served output is right, 0 once it is not",
            registry=self.registry,
        )
        self.last_pass = Gauge(
            "deploykit_canary_last_pass_timestamp_seconds",
            "Unix time of the last run whose answers were all right",
            registry=self.registry,
        )
        self.last_run = Gauge(
            "deploykit_canary_last_run_timestamp_seconds", "Unix time of the last run", registry=self.registry
        )
        self.duration = Gauge(
            "deploykit_canary_last_run_duration_seconds", "How long the last run took", registry=self.registry
        )
        self.misses = Gauge(
            "deploykit_canary_consecutive_misses",
            "Runs in a row that got no answer in time (timeouts, refused, HTTP 5xx/429)",
            registry=self.registry,
        )
        self.runs = Counter("deploykit_canary_runs", "Canary runs, by case", ["case"], registry=self.registry)
        self.failures = Counter(
            "deploykit_canary_failures",
            "Failed canary runs, by case and reason (wrong: corrupt output; miss: no answer in time)",
            ["case", "reason"],
            registry=self.registry,
        )
        self.warnings = Counter(
            "deploykit_canary_warnings",
            "Runs with a near-tie divergence, by case",
            ["case"],
            registry=self.registry,
        )
        self.requests = Counter(
            "deploykit_canary_requests", "Requests the canary sent", registry=self.registry
        )
        self.generated = Counter(
            "deploykit_canary_generated_tokens",
            "Tokens the canary made the server generate",
            registry=self.registry,
        )
        self.prompt = Counter(
            "deploykit_canary_prompt_tokens", "Prompt tokens the canary sent", registry=self.registry
        )
        self.live_nan = Counter(
            "deploykit_canary_live_nan_requests",
            "User requests vLLM counted with NaN logits while the canary watched (vllm:corrupted_requests)",
            registry=self.registry,
        )
        self.vllm_nan_counter = Gauge(
            "deploykit_canary_vllm_corrupted_requests",
            "vLLM's own vllm:corrupted_requests_total at the last read (-1: the server does not export it)",
            registry=self.registry,
        )
        self.vllm_nan_read = Gauge(
            "deploykit_canary_vllm_metrics_last_read_timestamp_seconds",
            "Unix time of the last successful read of the server's /metrics",
            registry=self.registry,
        )
        self.corrupt_cause = Gauge(
            "deploykit_canary_corrupt",
            "1 while the verdict is corrupt because of this cause (probe: a wrong answer to a canary run; "
            "live_nan: vLLM counted NaN logits on user traffic), else 0",
            ["cause"],
            registry=self.registry,
        )
        self.hung = Gauge(
            "deploykit_canary_hung",
            "1 while the engine is hung (requests waiting, no token produced for the bound), else 0",
            registry=self.registry,
        )
        self.misconfigured = Gauge(
            "deploykit_canary_misconfigured",
            "1 while the canary cannot judge for a reason of its own (a request the server refuses: too "
            "long, a key it does not take, a name it does not serve), else 0; never a reason to restart vLLM",
            registry=self.registry,
        )
        self.saturated = Gauge(
            "deploykit_canary_saturated",
            "1 while the canary's runs get no answer in time but vLLM's counters advance (a busy replica: it "
            "stays ready), else 0",
            registry=self.registry,
        )
        self.status = Gauge(
            "deploykit_canary_status",
            "1 for the canary's verdict now, 0 for the others (one series per status)",
            ["status"],
            registry=self.registry,
        )
        self.every = Gauge(
            "deploykit_canary_every_seconds", "Seconds between the canary's runs", registry=self.registry
        )
        self.request_timeout = Gauge(
            "deploykit_canary_request_timeout_seconds",
            "The deadline of one canary request (a run waits at most a few of them)",
            registry=self.registry,
        )
        self.server_restarts = Counter(
            "deploykit_canary_server_restarts",
            "Times the server came back under the canary after going away (restarts for corruption or a "
            "hang among them)",
            registry=self.registry,
        )
        self.progress_tokens = Gauge(
            "deploykit_canary_progress_tokens",
            "vLLM's token counters (generation + prompt, summed over engines) at the last read",
            registry=self.registry,
        )
        self.progress_advanced = Gauge(
            "deploykit_canary_progress_advanced_timestamp_seconds",
            "Unix time the engine's counters were last seen to advance (or it said it was quiet on purpose)",
            registry=self.registry,
        )
        self.server_started: Gauge | None = None
        """Registered at the first reading (`note_server_start`), never as a 0 that would read as a change."""
        for cause in ("probe", "live_nan"):
            self.corrupt_cause.labels(cause=cause).set(0)
        self.vllm_nan_counter.set(-1)
        self.healthy.set(1)
        self.show_status("starting")

    def note_server_start(self, started: float) -> None:
        """The server process's start time, as its /metrics said: Prometheus counts its changes
        (`changes()`) across the canary's own restarts, which a counter of this process cannot (a systemd
        canary starts afresh with each server)."""
        from prometheus_client import Gauge

        if self.server_started is None:
            self.server_started = Gauge(
                "deploykit_canary_server_start_timestamp_seconds",
                "Unix start time of the server process under the canary (vLLM's process_start_time_seconds "
                "at the last read): each change is a restart",
                registry=self.registry,
            )
        self.server_started.set(started)

    def show_status(self, status: str) -> None:
        """The one-hot `deploykit_canary_status` series."""
        from deploykit.canary.state import STATUSES

        for each in (*STATUSES, "unknown"):
            self.status.labels(status=each).set(1 if each == status else 0)

    def count_run(
        self, state: CanaryState, label: str, outcome: Outcome, report: SmokeReport, now: float, took: float
    ) -> None:
        """What one run did, and the verdict it left."""
        self.runs.labels(case=label).inc()
        if outcome != "pass":
            self.failures.labels(case=label, reason=outcome).inc()
        else:
            self.last_pass.set(now)
        if any(case.warning for case in report.cases):
            self.warnings.labels(case=label).inc()
        self.requests.inc(len(report.cases))
        self.generated.inc(sum(case.completion_tokens for case in report.cases))
        self.prompt.inc(sum(case.prompt_tokens or 0 for case in report.cases))
        self.last_run.set(now)
        self.duration.set(took)
        self.misses.set(state.consecutive_misses)
        self.set_verdict(state)

    def set_verdict(self, state: CanaryState) -> None:
        """The verdict gauges: healthy, saturated, hung, misconfigured, corrupt by cause, status."""
        self.healthy.set(1 if state.healthy else 0)
        self.saturated.set(1 if state.saturated else 0)
        self.show_status(state.status)
        self.hung.set(1 if state.hung else 0)
        self.misconfigured.set(1 if state.misconfigured else 0)
        for cause in ("probe", "live_nan"):
            now_cause = state.corrupt and state.cause == cause
            self.corrupt_cause.labels(cause=cause).set(1 if now_cause else 0)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))
