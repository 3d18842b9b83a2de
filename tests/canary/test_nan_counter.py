"""vLLM's NaN counter on live traffic: read from a real HTTP /metrics page (the text a real vLLM CPU 0.32
exported, recorded), judged by the canary between its runs, shown on its own /healthz and /metrics.

The e2e proof against a real vLLM is tests/e2e/test_live_nan_e2e.py; these need no server of vLLM's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploykit.canary import defaults
from deploykit.canary.config import config_for_profile, counts_nan_logits
from deploykit.canary.listener import serve_http
from deploykit.canary.nan_counter import CounterReading, CounterWatch, NanCounterFollower, read_counter
from deploykit.canary.runtime import CanaryRuntime
from deploykit.canary.server_page import read_page
from deploykit.canary.settings import DEFAULTS, check_settings
from deploykit.canary.state import CanaryState
from deploykit.endpoint import Endpoint
from deploykit.errors import CanaryError
from deploykit.plan import build_env
from deploykit.profile.load import load_profile
from tests.canary.test_canary import GOOD, WRONG, make, stored
from tests.http_server import serving


def vllm_page(total: float, created: float = 1.7961912571727862e09, engines: int = 1) -> str:
    """The part of a vLLM 0.32 (CPU) /metrics page that matters, as it exported it, `engines` series."""
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        "process_start_time_seconds 1.79619123431e+09",
        "# HELP vllm:corrupted_requests_total Corrupted requests, in terms of total number of requests "
        "with NaNs in logits.",
        "# TYPE vllm:corrupted_requests_total counter",
    ]
    lines += [
        f'vllm:corrupted_requests_total{{engine="{e}",model_name="tiny"}} {total}' for e in range(engines)
    ]
    lines += ["# TYPE vllm:corrupted_requests_created gauge"]
    lines += [
        f'vllm:corrupted_requests_created{{engine="{e}",model_name="tiny"}} {created}' for e in range(engines)
    ]
    lines += ['vllm:num_requests_running{engine="0",model_name="tiny"} 0.0']
    return "\n".join(lines) + "\n"


def test_the_counter_is_read_summed_over_engines_and_absent_without_the_variable() -> None:
    def total_and_start(text: str) -> tuple[float, float | None] | None:
        reading = read_counter(text)
        return None if reading is None else (reading.total, reading.started)

    assert total_and_start(vllm_page(1.0)) == (1.0, 1.7961912571727862e09)
    assert total_and_start(vllm_page(2.0, engines=2)) == (4.0, 1.7961912571727862e09)
    without = "\n".join(line for line in vllm_page(0).splitlines() if "corrupted" not in line)
    assert read_counter(without) is None
    # No `_created` series (an older client library): the process start time says which process it is.
    no_created = "\n".join(line for line in vllm_page(3).splitlines() if "_created" not in line)
    assert total_and_start(no_created) == (3.0, 1.79619123431e09)
    assert read_counter("vllm:corrupted_requests_total garbage\n") is None


def test_growth_is_counted_from_the_first_reading_and_from_zero_after_a_restart() -> None:
    watch = CounterWatch()
    assert watch.observe(CounterReading(2.0, 100.0)) == 0 and watch.before_watch == 2.0  # the baseline
    assert watch.observe(CounterReading(2.0, 100.0)) == 0
    assert watch.observe(CounterReading(3.0, 100.0)) == 1
    # A new process (its series created later) counted 1 already: all of it is new, even though the value
    # went neither up nor down from the last reading's point of view.
    assert watch.observe(CounterReading(3.0, 200.0)) == 3
    # Went down with no new process seen: a reset of the counter, a new baseline, never new NaN requests.
    assert watch.observe(CounterReading(1.0, None)) == 0 and watch.resets == 1
    assert watch.observe(CounterReading(1.0, None)) == 0
    assert watch.observe(CounterReading(2.0, None)) == 1


def test_a_counter_going_down_in_the_same_process_is_a_reset_not_nan_requests() -> None:
    """Issue 31: 10, 9, 8 ... with `_created` unchanged was read as "9 more request(s) with NaN logits"."""
    watch = CounterWatch()
    grown = [
        watch.observe(read_counter(vllm_page(float(total))) or CounterReading(0, None))
        for total in (10, 9, 8, 7, 7, 8)
    ]
    assert grown == [0, 0, 0, 0, 0, 1] and watch.resets == 3


def test_an_openmetrics_exemplar_is_not_the_value() -> None:
    page = vllm_page(3.0).replace(
        'model_name="tiny"} 3.0',
        'model_name="tiny"} 3.0 # {trace_id="ab}c",span="7"} 99.0 1796191300.5',
    )
    assert "# {trace_id" in page
    reading = read_counter(page)
    assert reading is not None and reading.total == 3.0
    # A `}` or `#` inside a quoted label value, escapes included, closes nothing.
    odd = 'vllm:corrupted_requests_total{engine="0",model_name="a}\\"#b"} 2.0 1796191300\n'
    reading = read_counter(odd)
    assert reading is not None and reading.total == 2.0


def test_engines_are_followed_one_by_one() -> None:
    """Engine 0 reset (5 → 0) while engine 1 grew (1 → 3): two new NaN requests, not a negative sum, not a
    reset of the whole page."""

    def page(first: float, second: float) -> str:
        return (
            f'vllm:corrupted_requests_total{{engine="0"}} {first}\n'
            f'vllm:corrupted_requests_total{{engine="1"}} {second}\n'
            'vllm:corrupted_requests_created{engine="0"} 100.0\n'
            'vllm:corrupted_requests_created{engine="1"} 100.0\n'
        )

    watch = CounterWatch()
    readings = [read_counter(page(5, 1)), read_counter(page(0, 3)), read_counter(page(1, 3))]
    assert [watch.observe(r) for r in readings if r is not None] == [0, 2, 1]
    assert watch.resets == 1
    # An engine whose series was created anew (its own `_created` moved, the process's earliest did not):
    # all that engine counted is new; the other engine's unchanged value adds nothing.
    moved = page(1, 2).replace('created{engine="1"} 100.0', 'created{engine="1"} 200.0')
    reading = read_counter(moved)
    assert reading is not None and reading.started == 100.0
    assert watch.observe(reading) == 2


def test_live_nan_is_corruption_at_once_and_heals_like_a_wrong_answer() -> None:
    state = CanaryState(rotation_len=2)
    assert state.observe("completion", "pass", "ok") == "healthy"
    assert state.observe_live_nan(1, 1) == "corrupt" and state.cause == "live_nan"
    assert "live traffic: vLLM counted 1 more request(s) with NaN logits" in state.diagnosis
    assert state.observe_live_nan(2, 3) is None and "now 3" in state.diagnosis
    assert state.observe("a", "pass", "ok") is None
    assert state.observe("b", "pass", "ok") == "healthy" and state.cause is None
    assert state.observe("a", "wrong", "NaN") == "corrupt" and state.cause == "probe"


class FakeVllmMetrics:
    """A real HTTP server whose /metrics page is vLLM's NaN counter at `total` (the test moves it)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.created = 1.7961912571727862e09
        self.reads = 0
        self.auth: list[str | None] = []

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                fake.reads += 1
                fake.auth.append(self.headers.get("Authorization"))
                body = vllm_page(fake.total, fake.created).encode() if self.path == "/metrics" else b"{}"
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        with serving(Handler) as url:
            yield url


def own_metrics(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=10).text
    return {
        key: float(value)
        for key, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    }


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


def test_a_growing_counter_turns_healthz_503_between_runs_with_a_row(tmp_path: Path) -> None:
    fake = FakeVllmMetrics()
    with fake.serving() as url:
        # One run, by hand, and no run loop: the counter alone must move the verdict.
        canary, script, _ = make(tmp_path, GOOD, metrics_every_s=0.1, api_key="k-123", hung_after_s=0)
        canary.config.endpoint = Endpoint(url, "k-123")
        seen: list[Any] = []
        canary.on_live_nan = seen.append
        canary.run_once()
        http = serve_http(canary, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{http.server_address[1]}"
        runtime = CanaryRuntime(canary)  # the page reader alone: no run loop
        runtime.start(runs=False)
        try:
            wait_for(lambda: fake.reads >= 3)
            assert httpx.get(base + "/healthz", timeout=10).status_code == 200
            assert own_metrics(base)["deploykit_canary_vllm_corrupted_requests"] == 0.0
            fake.total = 1.0  # a user request finished with NaN logits
            wait_for(lambda: httpx.get(base + "/healthz", timeout=10).status_code == 503)
            body = httpx.get(base + "/healthz", timeout=10).text
            assert body.startswith("corrupt: live traffic: vLLM counted 1 more request(s) with NaN logits")
            metrics = own_metrics(base)
            assert metrics["deploykit_canary_healthy"] == 0.0
            assert metrics["deploykit_canary_vllm_corrupted_requests"] == 1.0
            assert metrics["deploykit_canary_live_nan_requests_total"] == 1.0
            assert metrics['deploykit_canary_corrupt{cause="live_nan"}'] == 1.0
            assert metrics['deploykit_canary_corrupt{cause="probe"}'] == 0.0
        finally:
            runtime.close()
            http.shutdown()
            http.server_close()
    assert len(script.calls) == 1  # no run was needed
    assert [(s.grown, s.total, s.changed) for s in seen] == [(1.0, 1.0, "corrupt")]
    assert [(r.stage, r.verdict) for r in stored(tmp_path)] == [
        ("state:healthy", "pass"),
        ("state:corrupt", "fail"),
    ]
    assert "live traffic" in stored(tmp_path)[-1].diagnosis
    assert set(fake.auth) == {"Bearer k-123"}  # the key goes in a header, as for the runs


def test_a_restart_that_counted_nan_is_caught_and_a_wrong_run_is_still_the_probes(tmp_path: Path) -> None:
    fake = FakeVllmMetrics()
    fake.total = 5.0  # counted before the canary looked: warned about, not judged
    with fake.serving() as url:
        canary, _, _ = make(tmp_path, WRONG, metrics_every_s=1)
        canary.config.endpoint = Endpoint(url)
        warnings: list[str] = []
        canary.on_warning = warnings.append
        canary.take_page(read_page(canary.config.endpoint))
        assert canary.state.status == "starting"
        assert any("already counted 5 request(s) with NaN logits" in w for w in warnings)
        fake.total, fake.created = 1.0, fake.created + 60  # the server restarted and counted one since
        canary.take_page(read_page(canary.config.endpoint))
        assert canary.state.cause == "live_nan" and canary.metrics.live_nan._value.get() == 1.0
        canary.run_once()
        assert canary.state.cause == "probe"
        assert canary.metrics.corrupt_cause.labels(cause="probe")._value.get() == 1.0


def test_a_server_without_the_counter_is_said_once_and_never_judged(tmp_path: Path) -> None:
    class NoCounter(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"process_start_time_seconds 1.0\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    warnings: list[str] = []
    with serving(NoCounter) as url:
        follower = NanCounterFollower(on_warning=warnings.append)
        assert [follower.take(read_page(Endpoint(url)).nan) for _ in range(3)] == [0, 0, 0]
    assert len(warnings) == 1 and "VLLM_COMPUTE_NANS_IN_LOGITS=1" in warnings[0]
    # Nothing listening: a failed read is no verdict (the runs judge an unreachable server).
    canary, _, _ = make(tmp_path, metrics_every_s=1)
    canary.take_page(read_page(Endpoint("http://127.0.0.1:1", metrics_deadline_s=1)))
    assert canary.state.status == "starting" and canary.metrics.live_nan._value.get() == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 0.05])
def test_metrics_every_that_no_canary_can_use_is_refused(value: float) -> None:
    with pytest.raises(CanaryError, match="--metrics-every"):
        check_settings(metrics_every_s=value)


def test_metrics_every_zero_turns_the_reading_off(tmp_path: Path) -> None:
    check_settings(metrics_every_s=0)
    canary, _, _ = make(tmp_path, metrics_every_s=0, hung_after_s=0)
    assert not canary.config.reads_page
    canary, _, _ = make(tmp_path, metrics_every_s=0)  # the page is read for progress only
    assert canary.config.reads_page and canary.config.page_every_s == defaults.PROGRESS_EVERY_S


def test_the_plan_sets_the_variable_unless_the_profile_says_no() -> None:
    profile = load_profile("demo-cpu").profile
    assert build_env(profile, [])[0][defaults.NAN_COUNTER_ENV] == "1" and counts_nan_logits(profile)
    off = profile.model_copy(update={"serve": profile.serve.model_copy(update={"count_nan_logits": False})})
    assert defaults.NAN_COUNTER_ENV not in build_env(off, [])[0] and not counts_nan_logits(off)
    assert off.profile_id() != profile.profile_id()  # a different server, a different id
    env_off = profile.model_copy(update={"env": {**profile.env, defaults.NAN_COUNTER_ENV: "0"}})
    assert build_env(env_off, [])[0][defaults.NAN_COUNTER_ENV] == "0" and not counts_nan_logits(env_off)
    # The canary of a profile whose server does not count reads no /metrics for it.
    config = config_for_profile(off, None, endpoint=Endpoint("http://127.0.0.1:8000"), model_path=None)
    assert config.settings.metrics_every_s == 0
    on = config_for_profile(profile, None, endpoint=Endpoint("http://127.0.0.1:8000"), model_path=None)
    assert on.settings.metrics_every_s == DEFAULTS.metrics_every_s
