"""Progress, not just liveness: is the engine still working on the requests it has?

A hung engine (a kernel that never returns, a worker stuck in a collective) keeps vLLM's `/health` at 200
for hours: the API server is up, only the engine core's step never ends. What tells it apart from a busy
server is vLLM's own counters, read from its `/metrics` every few seconds (`deploykit.canary.server_page`
reads the page once for every reader): a busy engine's counters advance with every step, a hung one's
stand still while requests wait on it.

Requests wait on the engine when vLLM's scheduler said so at its last step (`vllm:num_requests_running` or
`vllm:num_requests_waiting` above 0), or when the canary's own request is in flight (the scheduler's
gauges are published at the end of a step, so the step that hangs never reports the request it holds).
Progress is any change of the token counters (`vllm:generation_tokens_total`, `vllm:prompt_tokens_total`)
or of the iteration counters (`vllm:iteration_tokens_total`'s count and sum: one observation per engine
step, so a long prompt's prefill chunks count before its first token does), summed over engines; a
decrease is a new process, which is progress too.

An engine that is quiet on purpose is not hung: asleep (`vllm:engine_sleep_state{sleep_state="awake"}` 0),
loading new weights (`vllm:rl_weight_update_operations_in_flight` above 0), or paused (`/pause`; vLLM says
so on `/is_paused`, read only when the counters stand still). While it is, the clock of a hang is held.
`ProgressWatch` is the pure judgement (no clock, no I/O).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

TOKEN_COUNTERS = ("vllm:generation_tokens", "vllm:prompt_tokens")
"""Counter families (samples `<name>_total`) whose change is progress."""
ITERATION_HISTOGRAM = "vllm:iteration_tokens_total"
"""A histogram observed once per engine step (its `_count` and `_sum` samples): steps are progress."""
QUEUE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
"""Gauges that say requests are on the engine."""
SLEEP_GAUGE = "vllm:engine_sleep_state"
"""Per engine and `sleep_state`; `awake` 0 means the engine sleeps (`/sleep`): quiet on purpose."""
PROCESS_START = "process_start_time_seconds"
"""The server process's start time (prometheus_client's process collector, on vLLM's page)."""
WEIGHT_UPDATES_GAUGE = "vllm:rl_weight_update_operations_in_flight"
"""Weight updates running now (`/update_weights` and friends): the engine does not step meanwhile."""


@dataclass(frozen=True)
class ProgressReading:
    """One read of vLLM's /metrics: work done so far, requests on the engine at its last step, and whether
    the engine said it is quiet on purpose."""

    tokens: float
    queued: float
    steps: float = 0.0
    """`vllm:iteration_tokens_total` count + sum over engines (0 where the page lacks it)."""
    asleep: bool = False
    reloading: bool = False
    started: float | None = None
    """The server process's start (`process_start_time_seconds`): each change is a restart."""
    engines: tuple[tuple[str, float, float], ...] = ()
    """Per engine (its `engine` label): work done (tokens + steps) and requests on it. With data parallel,
    one wedged engine among busy ones still has requests waiting and its own counters standing still."""

    @property
    def work(self) -> tuple[float, float]:
        """What changes when the engine does anything: tokens, and steps."""
        return (self.tokens, self.steps)

    @property
    def quiet_on_purpose(self) -> str | None:
        """Why the engine makes no progress on purpose, or None."""
        if self.asleep:
            return "the engine sleeps (vllm:engine_sleep_state awake=0)"
        if self.reloading:
            return "the engine is loading new weights (vllm:rl_weight_update_operations_in_flight > 0)"
        return None


def read_progress(text: str) -> ProgressReading | None:
    """The token and iteration counters, queue gauges and quiet states of a Prometheus text page, summed
    over engines; None when the page lacks the token counters (not vLLM, or vLLM run with
    `--disable-log-stats`) or cannot be parsed."""
    from prometheus_client.parser import text_string_to_metric_families

    tokens: float | None = None
    queued = steps = 0.0
    work_by_engine: dict[str, float] = {}
    queued_by_engine: dict[str, float] = {}
    asleep = reloading = False
    started: float | None = None
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if not math.isfinite(sample.value):
                    continue
                engine = sample.labels.get("engine", "")
                if family.name in TOKEN_COUNTERS and sample.name == family.name + "_total":
                    tokens = (tokens or 0.0) + sample.value
                    work_by_engine[engine] = work_by_engine.get(engine, 0.0) + sample.value
                elif family.name in QUEUE_GAUGES and sample.name == family.name:
                    queued += max(sample.value, 0.0)
                    queued_by_engine[engine] = queued_by_engine.get(engine, 0.0) + max(sample.value, 0.0)
                elif sample.name in (ITERATION_HISTOGRAM + "_count", ITERATION_HISTOGRAM + "_sum"):
                    steps += sample.value
                    work_by_engine[engine] = work_by_engine.get(engine, 0.0) + sample.value
                elif sample.name == SLEEP_GAUGE and sample.labels.get("sleep_state") == "awake":
                    asleep = asleep or sample.value == 0
                elif sample.name == WEIGHT_UPDATES_GAUGE:
                    reloading = reloading or sample.value > 0
                elif sample.name == PROCESS_START:
                    started = sample.value
    except (ValueError, TypeError, IndexError):
        return None
    if tokens is None:
        return None
    engines = tuple(
        (engine, work_by_engine.get(engine, 0.0), queued_by_engine.get(engine, 0.0))
        for engine in sorted(set(work_by_engine) | set(queued_by_engine))
    )
    return ProgressReading(
        tokens=tokens,
        queued=queued,
        steps=steps,
        asleep=asleep,
        reloading=reloading,
        started=started,
        engines=engines,
    )


@dataclass
class ProgressWatch:
    """Since when no work was done while requests waited (pure: the caller's monotonic clock)."""

    last_work: tuple[float, float] | None = None
    advanced_at: float | None = None
    """When the counters were last seen to change (the first reading counts as a change), or the engine
    last said it was quiet on purpose (a pause holds the clock)."""
    queued_since: float | None = None
    """Since when every reading said requests were on the engine (None: the last one said none)."""
    engine_work: dict[str, float] = field(default_factory=dict)
    engine_advanced_at: dict[str, float] = field(default_factory=dict)
    engine_queued_since: dict[str, float] = field(default_factory=dict)
    """The same, per engine (data parallel): a wedged engine is told even while the others advance."""

    def observe(self, reading: ProgressReading, now: float, quiet_on_purpose: bool = False) -> None:
        if self.last_work is None or reading.work != self.last_work or quiet_on_purpose:
            self.advanced_at = now
        self.last_work = reading.work
        if reading.queued <= 0:
            self.queued_since = None
        elif self.queued_since is None:
            self.queued_since = now
        for engine, work, queued in reading.engines:
            if self.engine_work.get(engine) != work or quiet_on_purpose:
                self.engine_advanced_at[engine] = now
            self.engine_work[engine] = work
            if queued <= 0:
                self.engine_queued_since.pop(engine, None)
            else:
                self.engine_queued_since.setdefault(engine, now)

    @property
    def last_tokens(self) -> float | None:
        return None if self.last_work is None else self.last_work[0]

    def forget(self) -> None:
        """The server restarted: what was seen says nothing about the engine now. (A read that fails is
        no reading at all: the last good one stands, since the counters only grow within one process.)"""
        self.last_work = self.advanced_at = self.queued_since = None
        self.engine_work, self.engine_advanced_at, self.engine_queued_since = {}, {}, {}

    def advanced_within(self, now: float, seconds: float) -> bool:
        """Whether the engine did work (or was quiet on purpose) in the last `seconds`: a replica whose
        answers are late while this holds is saturated, not unreachable."""
        return self.advanced_at is not None and now - self.advanced_at <= seconds

    def stalled_for(self, now: float, canary_waiting_since: float | None = None) -> float | None:
        """Seconds requests have waited with no work done; None when nothing waits, or nothing is
        known (no reading since the last `forget`). `canary_waiting_since`: since when the canary's own
        requests have gone unanswered."""
        if self.advanced_at is None:
            return None
        stalls = [
            now - max(self.engine_advanced_at[engine], since)
            for engine, since in self.engine_queued_since.items()
            if engine in self.engine_advanced_at
        ]
        waiting = [at for at in (self.queued_since, canary_waiting_since) if at is not None]
        if waiting:
            stalls.append(now - max(self.advanced_at, min(waiting)))
        return max(0.0, *stalls) if stalls else None


def hung_diagnosis(stalled_s: float, reading_tokens: float | None) -> str:
    tokens = "" if reading_tokens is None else f" (vLLM's token counters stuck at {reading_tokens:g})"
    return (
        f"the engine is hung: requests have waited {stalled_s:.0f} s with no token produced and no engine "
        f"step{tokens}; /health may still say 200"
    )
