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
        for cause in ("probe", "live_nan"):
            self.corrupt_cause.labels(cause=cause).set(0)
        self.vllm_nan_counter.set(-1)
        self.healthy.set(1)

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
        """The verdict gauges: healthy, hung, misconfigured, and corrupt by cause."""
        self.healthy.set(1 if state.healthy else 0)
        self.hung.set(1 if state.hung else 0)
        self.misconfigured.set(1 if state.misconfigured else 0)
        for cause in ("probe", "live_nan"):
            now_cause = state.corrupt and state.cause == cause
            self.corrupt_cause.labels(cause=cause).set(1 if now_cause else 0)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))
