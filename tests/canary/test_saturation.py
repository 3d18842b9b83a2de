"""A replica whose answers are late while vLLM's counters advance is `saturated`: shown on `/healthz` (200)
and in metrics, never a reason to fail readiness; `unreachable` (readiness fails) only while no progress is
seen (issue 45). The judgement runs on explicit monotonic times: nothing here waits on a clock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from deploykit.canary.progress import ProgressReading
from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.runtime import CanaryRuntime
from deploykit.canary.server_page import ServerPage
from deploykit.canary.settings import CanarySettings
from deploykit.canary.state import READY, STATUSES, CanaryState
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
from deploykit.render import pod_probe
from deploykit.smoke import SmokeReport
from tests.canary.test_hung import GOOD, MISS


def make_canary(tmp_path: Path, report: SmokeReport = MISS) -> Canary:
    return Canary(
        CanaryConfig(
            endpoint=Endpoint("http://127.0.0.1:1"),
            served_name="m",
            cases=[SmokeCase(kind="completion")],
            settings=CanarySettings(miss_limit=3, timeout_s=5.0),
            store=False,
            verdict_file=str(tmp_path / "verdict.json"),
            hung_after_s=60.0,
        ),
        runner=lambda *a, **k: report,
    )


def gauge(canary: Canary, status: str) -> float:
    return float(canary.metrics.status.labels(status=status)._value.get())


def test_misses_while_tokens_flow_are_saturated_and_stay_ready(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    for tokens in range(3):  # the engine works: its counters advance, just before each run
        canary.observe_progress(ProgressReading(tokens=float(tokens), queued=40), now=None)
        canary.run_once()
    assert canary.state.status == "saturated"
    ready, text = canary.health()
    assert ready and text.startswith("saturated: 3 runs in a row got no answer in time")
    assert canary.metrics.saturated._value.get() == 1 and gauge(canary, "saturated") == 1
    assert gauge(canary, "unreachable") == 0 and canary.metrics.healthy._value.get() == 0
    canary.runner = lambda *a, **k: GOOD
    assert canary.run_once().changed == "healthy" and canary.metrics.saturated._value.get() == 0


def test_misses_with_no_progress_are_unreachable_until_the_counters_move(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    for _ in range(3):
        canary.run_once()  # no reading at all: nothing says the engine works
    assert canary.state.status == "unreachable" and not canary.health()[0]
    canary.observe_progress(ProgressReading(tokens=1, queued=0), now=1000.0)
    assert canary.observe_progress(ProgressReading(tokens=2, queued=0), now=1002.0) is None  # said at once
    assert canary.state.status == "saturated" and canary.health()[0]
    # The counters stand still for longer than the window, nothing queued: unreachable again.
    assert canary.observe_progress(ProgressReading(tokens=2, queued=0), now=1070.0) == "unreachable"


def test_a_stalled_saturated_replica_turns_hung_not_unreachable(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    canary.observe_progress(ProgressReading(tokens=1, queued=40), now=0.0)
    state = canary.state
    state.consecutive_misses, state.status = 3, "saturated"
    assert canary.observe_progress(ProgressReading(tokens=1, queued=40), now=61.0) == "hung"


def test_the_state_machine_alone() -> None:
    state = CanaryState(miss_limit=2)
    assert state.observe("c", "miss", "late", progressing=True) is None
    assert state.observe("c", "miss", "late", progressing=True) == "saturated" and state.ready
    assert state.observe_progressing(False) == "unreachable" and not state.ready
    assert state.observe_progressing(True) == "saturated"
    assert state.restarted() == "starting"
    state.observe("c", "wrong", "id 0")
    assert state.observe_progressing(True) is None and state.status == "corrupt"  # corrupt stays


@pytest.mark.parametrize("status", STATUSES)
def test_the_pod_probes_know_every_status_and_fail_readiness_exactly_off_ready(status: str) -> None:
    assert status in pod_probe.STATUSES
    assert (status in pod_probe.FAILING["ready"]) == (status not in READY and status != "misconfigured")
    assert (status in pod_probe.FAILING["live"]) == (status in ("corrupt", "hung"))


# --- a restart is a new process, not a /health that was slow under load ------------------------------


def page_from(started: float, tokens: float = 5.0) -> ServerPage:
    return ServerPage(progress=ProgressReading(tokens=tokens, queued=40, started=started))


def test_a_health_that_was_slow_under_load_is_no_restart_once_the_start_time_is_known(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The overload bench: a canary's restart watcher saw vLLM's /health miss its 2 s poll under 4x load and
    come back, took it for a restart, dropped the verdict and counted a restart (the cap alert counts
    those). The server's start time, on the page the canary reads anyway, says it was the same process."""
    answers = iter([True, False, True, False, True])
    stop = threading.Event()

    def health(endpoint: Endpoint, timeout: float) -> bool:
        try:
            return next(answers)
        except StopIteration:
            stop.set()
            return True

    monkeypatch.setattr("deploykit.canary.discovery.server_health_ok", health)
    canary = make_canary(tmp_path)
    canary.take_page(page_from(1000.0))
    for _ in range(3):
        canary.run_once()
    assert canary.state.status == "saturated"
    CanaryRuntime(canary, watch_restarts=True, restart_poll_s=0, stop=stop)._watch_restarts(stop)
    assert canary.state.status == "saturated" and canary.metrics.server_restarts._value.get() == 0
    # No page read yet (or none at all): /health away and back is the only sign, as before.
    fresh = make_canary(tmp_path)
    answers, stop = iter([True, False, True]), threading.Event()  # (the fake above reads both anew)
    CanaryRuntime(fresh, watch_restarts=True, restart_poll_s=0, stop=stop)._watch_restarts(stop)
    assert fresh.metrics.server_restarts._value.get() == 1


def test_a_new_start_time_is_a_restart_even_when_health_never_looked_away(tmp_path: Path) -> None:
    warnings: list[str] = []
    canary = make_canary(tmp_path, report=MISS)
    canary.on_warning = warnings.append
    canary.take_page(page_from(1000.0))
    for _ in range(3):
        canary.run_once()
    assert canary.state.status == "saturated"
    canary.take_page(page_from(2000.0, tokens=0.0))  # a new process: its counters start again
    assert canary.state.status == "starting" and canary.metrics.server_restarts._value.get() == 1
    assert any("process start time changed" in line for line in warnings), warnings
    canary.take_page(page_from(2000.0, tokens=3.0))
    assert canary.metrics.server_restarts._value.get() == 1  # the same process: counted once


def test_serve_restarting_vllm_counts_once_and_keeps_corruption_until_passes(tmp_path: Path) -> None:
    """serve restarts vLLM itself (`engine_replaced`): one restart; the new process's first start time is
    no second one, and corruption still waits for a rotation of passes (it is not dropped as a restart)."""
    canary = make_canary(tmp_path)
    canary.take_page(page_from(1000.0))
    canary.state.observe("c", "wrong", "id 0")
    canary.engine_replaced()
    canary.take_page(page_from(2000.0, tokens=0.0))
    assert canary.metrics.server_restarts._value.get() == 1 and canary.state.status == "corrupt"


def test_serve_restarting_a_hung_vllm_counts_once_too(tmp_path: Path) -> None:
    canary = make_canary(tmp_path)
    canary.take_page(page_from(1000.0))
    canary.state.observe_hung("stuck")
    assert canary.engine_replaced() == "starting"  # the hang was the old engine's
    canary.take_page(page_from(2000.0, tokens=0.0))
    assert canary.metrics.server_restarts._value.get() == 1
