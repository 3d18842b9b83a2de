"""vLLM's own NaN counter on live traffic: read `vllm:corrupted_requests_total` from the server's /metrics
every few seconds and tell the canary as soon as it grows.

The probe runs see one request a minute; a user request whose logits held NaN in between would go unseen.
With `VLLM_COMPUTE_NANS_IN_LOGITS=1` vLLM counts such requests itself (when each finishes), so one cheap
GET of /metrics every `metrics_every_s` seconds (`server_page`, the one reader of the page) catches them
within seconds of the answer.

A counter only grows, except when the server restarts: then it starts again from zero. A restart is seen
by the series' `_created` time (or the process start time) changing, and then everything the new process
counted is new. A value that goes down with no such change is a reset, never new NaN requests: the new
value is the baseline. Each series (one per engine) is followed on its own, so one engine's reset does not
hide another's growth, and an OpenMetrics exemplar after a value is not taken for it.

The first reading is the baseline: what the server counted before the canary looked is reported once as a
warning, never as a verdict the canary did not see happen.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

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
    series: tuple[tuple[str, float, float | None], ...] = ()
    """Per series (one per engine and model): its labels as written, its value, its `_created` time."""

    def by_series(self) -> dict[str, tuple[float, float | None]]:
        """labels → (value, created); one unnamed series when the reading was made without them."""
        if not self.series:
            return {"": (self.total, self.started)}
        return {labels: (value, created) for labels, value, created in self.series}


@dataclass(frozen=True)
class Sample:
    """One line of a Prometheus or OpenMetrics text page: `name{labels} value [timestamp] [# exemplar]`."""

    name: str
    labels: str
    value: float


def _label_end(line: str, start: int) -> int:
    """The index of the `}` closing the label set opened at `start`; -1 when it is not closed. A `}` inside a
    quoted label value (escapes included) does not close it."""
    quoted = False
    index = start + 1
    while index < len(line):
        char = line[index]
        if quoted:
            if char == "\\":
                index += 2
                continue
            if char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char == "}":
            return index
        index += 1
    return -1


def parse_sample(line: str) -> Sample | None:
    """One sample line; None for comments, blank lines and lines that are not one. An OpenMetrics exemplar
    after the value (`... 3.0 # {trace_id="a"} 1.0 1700000000`) is not the value."""
    if not line or line[0] == "#":
        return None
    name_end = len(line)
    for index, char in enumerate(line):
        if char in "{ \t":
            name_end = index
            break
    if name_end == 0:
        return None
    labels = ""
    rest_at = name_end
    if name_end < len(line) and line[name_end] == "{":
        close = _label_end(line, name_end)
        if close < 0:
            return None
        labels, rest_at = line[name_end + 1 : close], close + 1
    fields = line[rest_at:].partition("#")[0].split()
    if not fields:
        return None
    try:
        return Sample(line[:name_end], labels, float(fields[0]))
    except ValueError:
        return None


def read_counter(text: str) -> CounterReading | None:
    """The NaN counter in a Prometheus text page, per series (one per engine) and summed; None when the page
    has none (vLLM started without `VLLM_COMPUTE_NANS_IN_LOGITS=1`)."""
    values: dict[str, float] = {}
    created_by_labels: dict[str, float] = {}
    process_start: float | None = None
    for line in text.splitlines():
        if not line.startswith((TOTAL, CREATED, PROCESS_START)):
            continue
        sample = parse_sample(line)
        if sample is None or not math.isfinite(sample.value):
            continue
        if sample.name == TOTAL and sample.value >= 0:
            values[sample.labels] = sample.value  # a series written twice: the last one
        elif sample.name == CREATED:
            created_by_labels[sample.labels] = sample.value
        elif sample.name == PROCESS_START:
            process_start = sample.value
    if not values:
        return None
    created = min(created_by_labels.values()) if created_by_labels else None
    series = tuple((labels, value, created_by_labels.get(labels)) for labels, value in sorted(values.items()))
    return CounterReading(
        total=sum(values.values()),
        started=created if created is not None else process_start,
        series=series,
    )


@dataclass
class CounterWatch:
    """What the readings so far say (pure: no clock, no I/O): the last one, and how much each new one adds.

    A counter only grows. A series that went down without its process changing was reset (or is not a
    counter): that is a new baseline, never new NaN requests; `resets` counts them for a warning."""

    last: CounterReading | None = None
    before_watch: float = 0.0
    """What the server had counted before the first reading (not seen happen, so only warned about)."""
    resets: int = 0

    def observe(self, reading: CounterReading) -> float:
        """Take a reading; returns the requests with NaN logits counted since the previous one."""
        previous, self.last = self.last, reading
        if previous is None:
            self.before_watch = reading.total
            return 0.0
        if None not in (reading.started, previous.started) and reading.started != previous.started:
            return reading.total  # a new server process: everything it counted is new
        before = previous.by_series()
        grown = 0.0
        for labels, (value, created) in reading.by_series().items():
            if labels not in before:
                continue  # a series that appeared: its first value is its baseline
            old, old_created = before[labels]
            if None not in (created, old_created) and created != old_created:
                grown += value  # this engine's series was created anew: all it counted is new
            elif value > old:
                grown += value - old
            elif value < old:
                self.resets += 1
        return grown


@dataclass
class NanCounterFollower:
    """Follows the NaN counter over the readings `server_page` hands it (pure: no clock, no I/O), and says
    once what a person should know: the counter is absent, it went down, it had counted before we looked."""

    watch: CounterWatch = field(default_factory=CounterWatch)
    on_warning: Callable[[str], None] | None = None
    absent_said: bool = False

    def take(self, reading: CounterReading | None) -> float:
        """One page's reading (None: the page has no NaN counter); returns the growth since the last."""
        if reading is None:
            if not self.absent_said:
                self.absent_said = True
                self._warn(
                    f"the server's /metrics has no {TOTAL}: NaN logits on live traffic are not counted "
                    f"(start vLLM with {defaults.NAN_COUNTER_ENV}=1; deploykit's plan sets it)"
                )
            return 0.0
        first = self.watch.last is None
        previous_total = None if self.watch.last is None else self.watch.last.total
        resets = self.watch.resets
        grown = self.watch.observe(reading)
        if self.watch.resets > resets:
            self._warn(
                f"vLLM's {TOTAL} went down ({previous_total:g} → {reading.total:g}) with no restart seen: "
                "taken as a reset of the counter, not as requests with NaN logits"
            )
        if first and reading.total > 0:
            self._warn(
                f"the server had already counted {reading.total:g} request(s) with NaN logits before the "
                "canary started watching (not judged: restart it to start afresh)"
            )
        return grown

    def _warn(self, message: str) -> None:
        if self.on_warning is not None:
            self.on_warning(message)
