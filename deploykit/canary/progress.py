"""Progress, not just liveness: is the engine still producing tokens for the requests it has?

A hung engine (a kernel that never returns, a worker stuck in a collective) keeps vLLM's `/health` at 200
for hours: the API server is up, only the engine core's step never ends. What tells it apart from a busy
server is vLLM's own token counters, read from its `/metrics` every few seconds: a busy engine's counters
advance with every step, a hung one's stand still while requests wait on it.

Requests wait on the engine when vLLM's scheduler said so at its last step (`vllm:num_requests_running` or
`vllm:num_requests_waiting` above 0), or when the canary's own request is in flight (the scheduler's
gauges are published at the end of a step, so the step that hangs never reports the request it holds).
Progress is any change of `vllm:generation_tokens_total` or `vllm:prompt_tokens_total` (summed over
engines; a decrease is a new process, which is progress too). `ProgressWatch` is the pure judgement (no
clock, no I/O); `ProgressPoller` reads the page on its own thread.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from deploykit.canary import defaults

TOKEN_COUNTERS = ("vllm:generation_tokens", "vllm:prompt_tokens")
"""Counter families (samples `<name>_total`) whose change is progress."""
QUEUE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
"""Gauges that say requests are on the engine."""


@dataclass(frozen=True)
class ProgressReading:
    """One read of vLLM's /metrics: tokens processed so far, and requests on the engine at its last step."""

    tokens: float
    queued: float


def read_progress(text: str) -> ProgressReading | None:
    """The token counters and queue gauges of a Prometheus text page, summed over engines; None when the
    page lacks the token counters (not vLLM, or vLLM run with `--disable-log-stats`) or cannot be parsed."""
    from prometheus_client.parser import text_string_to_metric_families

    tokens: float | None = None
    queued = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isfinite(sample.value):
                    continue
                if family.name in TOKEN_COUNTERS and sample.name == family.name + "_total":
                    tokens = (tokens or 0.0) + sample.value
                elif family.name in QUEUE_GAUGES and sample.name == family.name:
                    queued += max(sample.value, 0.0)
    except (ValueError, TypeError, IndexError):
        return None
    return None if tokens is None else ProgressReading(tokens=tokens, queued=queued)


@dataclass
class ProgressWatch:
    """Since when no token was produced while requests waited (pure: the caller's monotonic clock)."""

    last_tokens: float | None = None
    advanced_at: float | None = None
    """When the token counters were last seen to change (the first reading counts as a change)."""
    queued_since: float | None = None
    """Since when every reading said requests were on the engine (None: the last one said none)."""

    def observe(self, reading: ProgressReading, now: float) -> None:
        if self.last_tokens is None or reading.tokens != self.last_tokens:
            self.advanced_at = now
        self.last_tokens = reading.tokens
        if reading.queued <= 0:
            self.queued_since = None
        elif self.queued_since is None:
            self.queued_since = now

    def forget(self) -> None:
        """The server restarted: what was seen says nothing about the engine now. (A read that fails is
        no reading at all: the last good one stands, since the counters only grow within one process.)"""
        self.last_tokens = self.advanced_at = self.queued_since = None

    def stalled_for(self, now: float, canary_waiting_since: float | None = None) -> float | None:
        """Seconds requests have waited with no token produced; None when nothing waits, or nothing is
        known (no reading since the last `forget`). `canary_waiting_since`: since when the canary's own
        requests have gone unanswered."""
        if self.advanced_at is None:
            return None
        waiting = [at for at in (self.queued_since, canary_waiting_since) if at is not None]
        if not waiting:
            return None
        return max(0.0, now - max(self.advanced_at, min(waiting)))


def hung_diagnosis(stalled_s: float, reading_tokens: float | None) -> str:
    tokens = "" if reading_tokens is None else f" (vLLM's token counters stuck at {reading_tokens:g})"
    return (
        f"the engine is hung: requests have waited {stalled_s:.0f} s with no token produced{tokens}; "
        "/health may still say 200"
    )


@dataclass
class ProgressPoller:
    """Reads `url`/metrics every `every_s` seconds on its own thread; `on_reading` gets each reading (None:
    the read failed or the page has no token counters)."""

    url: str
    every_s: float = defaults.PROGRESS_EVERY_S
    api_key: str | None = None
    timeout_s: float = defaults.METRICS_TIMEOUT_S
    max_bytes: int = defaults.PROGRESS_PAGE_MAX_BYTES
    on_reading: Callable[[ProgressReading | None], object] | None = None
    on_warning: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        self._absent_said = False

    def fetch(self) -> ProgressReading | None:
        """One GET of /metrics through the one bounded read (at most `max_bytes`, `timeout_s` all told);
        None when it fails or has no token counters."""
        from deploykit.http_bounded import fetch

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        reply = fetch(
            self.url.rstrip("/") + "/metrics",
            headers=headers,
            deadline_s=self.timeout_s,
            max_bytes=self.max_bytes,
        )
        if not reply.ok or reply.status != 200:
            return None
        reading = read_progress(reply.text)
        if reading is None and not self._absent_said:
            self._absent_said = True
            self._warn(
                "the server's /metrics has no vllm:generation_tokens_total: a hung engine is not told from a "
                "busy one (vLLM started with --disable-log-stats?)"
            )
        return reading

    def run_forever(self, stop: threading.Event) -> None:
        """A read every `every_s` seconds until `stop`; a failing callback never ends the watching."""
        while not stop.is_set():
            try:
                reading = self.fetch()
                if self.on_reading is not None and not stop.is_set():
                    self.on_reading(reading)
            except Exception as exc:  # the watcher must outlive any one bad read
                from deploykit.net import redact_text  # its text can carry the URL or a header value

                self._warn(
                    f"reading the server's progress failed: {redact_text(f'{type(exc).__name__}: {exc}')}"
                )
            stop.wait(self.every_s)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run_forever, args=(stop,), name="deploykit-canary-progress", daemon=True
        )
        thread.start()
        return thread

    def _warn(self, message: str) -> None:
        if self.on_warning is not None:
            self.on_warning(message)
