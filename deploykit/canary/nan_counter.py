"""vLLM's own NaN counter on live traffic: read `vllm:corrupted_requests_total` from the server's /metrics
every few seconds and tell the canary as soon as it grows.

The probe runs see one request a minute; a user request whose logits held NaN in between would go unseen.
With `VLLM_COMPUTE_NANS_IN_LOGITS=1` vLLM counts such requests itself (when each finishes), so one cheap
GET of /metrics every `metrics_every_s` seconds catches them within seconds of the answer.

A counter only grows, except when the server restarts: then it starts again from zero. A restart is seen
by the series' `_created` time (or the process start time) changing, else by the value going down; either
way everything the new process counted is new. The first reading is the baseline: what the server counted
before the canary looked is reported once as a warning, never as a verdict the canary did not see happen.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from deploykit.canary import defaults

TOTAL = defaults.NAN_COUNTER + "_total"
CREATED = defaults.NAN_COUNTER + "_created"
PROCESS_START = "process_start_time_seconds"


@dataclass(frozen=True)
class CounterReading:
    """One read of vLLM's /metrics: the NaN counter summed over engines, and what says which process."""

    total: float
    started: float | None
    """The series' creation time (else the process start time): a change means a new server process."""


def _sample(line: str) -> tuple[str, float] | None:
    """`name{labels} value [timestamp]` → (name, value); None for comments and lines that are not one."""
    if not line or line[0] == "#":
        return None
    name_end = min((i for i in (line.find("{"), line.find(" ")) if i >= 0), default=-1)
    if name_end <= 0:
        return None
    rest = line[line.rindex("}") + 1 :] if line[name_end] == "{" and "}" in line else line[name_end:]
    fields = rest.split()
    if not fields:
        return None
    try:
        return line[:name_end], float(fields[0])
    except ValueError:
        return None


def read_counter(text: str) -> CounterReading | None:
    """The NaN counter in a Prometheus text page, summed over its series (one per engine); None when the
    page has none (vLLM started without `VLLM_COMPUTE_NANS_IN_LOGITS=1`)."""
    total: float | None = None
    created: float | None = None
    process_start: float | None = None
    for line in text.splitlines():
        if not line.startswith((TOTAL, CREATED, PROCESS_START)):
            continue
        sample = _sample(line)
        if sample is None or not math.isfinite(sample[1]):
            continue
        name, value = sample
        if name == TOTAL:
            total = (total or 0.0) + value
        elif name == CREATED:
            created = value if created is None else min(created, value)
        elif name == PROCESS_START:
            process_start = value
    if total is None:
        return None
    return CounterReading(total=total, started=created if created is not None else process_start)


@dataclass
class CounterWatch:
    """What the readings so far say (pure: no clock, no I/O): the last one, and how much each new one adds."""

    last: CounterReading | None = None
    before_watch: float = 0.0
    """What the server had counted before the first reading (not seen happen, so only warned about)."""

    def observe(self, reading: CounterReading) -> float:
        """Take a reading; returns the requests with NaN logits counted since the previous one."""
        previous, self.last = self.last, reading
        if previous is None:
            self.before_watch = reading.total
            return 0.0
        new_process = None not in (reading.started, previous.started) and reading.started != previous.started
        restarted = new_process or reading.total < previous.total
        return reading.total if restarted else reading.total - previous.total


@dataclass
class NanCounterPoller:
    """Reads `url`/metrics every `every_s` seconds on its own thread and reports each growth."""

    url: str
    every_s: float = defaults.METRICS_EVERY_S
    api_key: str | None = None
    timeout_s: float = defaults.METRICS_TIMEOUT_S
    on_growth: Callable[[float, CounterReading], object] | None = None
    """Called with how many more requests had NaN logits, and the reading that showed it."""
    on_reading: Callable[[CounterReading | None], None] | None = None
    """Called after every successful read (None: the page has no NaN counter)."""
    on_warning: Callable[[str], None] | None = None
    watch: CounterWatch | None = None

    def __post_init__(self) -> None:
        self.watch = self.watch or CounterWatch()
        self._absent_said = False

    def fetch(self) -> CounterReading | Exception | None:
        """One GET of /metrics: the reading, None when there is no NaN counter, or the error."""
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = httpx.get(self.url.rstrip("/") + "/metrics", headers=headers, timeout=self.timeout_s)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            return exc
        return read_counter(response.text)

    def poll_once(self) -> float:
        """Read once and report; returns the growth seen (0 when none, or when the read failed)."""
        assert self.watch is not None
        result = self.fetch()
        if isinstance(result, Exception):
            return 0.0  # the probe runs judge an unreachable server; a failed read waits for the next
        if self.on_reading is not None:
            self.on_reading(result)
        if result is None:
            if not self._absent_said:
                self._absent_said = True
                self._warn(
                    f"the server's /metrics has no {TOTAL}: NaN logits on live traffic are not counted "
                    f"(start vLLM with {defaults.NAN_COUNTER_ENV}=1; deploykit's plan sets it)"
                )
            return 0.0
        first = self.watch.last is None
        grown = self.watch.observe(result)
        if first and result.total > 0:
            self._warn(
                f"the server had already counted {result.total:g} request(s) with NaN logits before the "
                "canary started watching (not judged: restart it to start afresh)"
            )
        if grown > 0 and self.on_growth is not None:
            self.on_growth(grown, result)
        return grown

    def run_forever(self, stop: threading.Event) -> None:
        """A read every `every_s` seconds until `stop`; a failing callback never ends the watching."""
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # the watcher must outlive any one bad read
                from deploykit.net import redact_text

                self._warn(
                    f"reading the server's NaN counter failed: {redact_text(f'{type(exc).__name__}: {exc}')}"
                )
            stop.wait(self.every_s)

    def start(self, stop: threading.Event) -> threading.Thread:
        thread = threading.Thread(
            target=self.run_forever, args=(stop,), name="deploykit-canary-nan-counter", daemon=True
        )
        thread.start()
        return thread

    def _warn(self, message: str) -> None:
        if self.on_warning is not None:
            self.on_warning(message)
