"""Progress, not just liveness: a hung engine is `hung`, a busy one is not; a stuck or dead canary never
leaves `healthy` behind (issue 31).

The judgement (`ProgressWatch`, `Canary.observe_progress`) runs on explicit monotonic times, so nothing here
waits on a clock; the poller is proven against a real loopback HTTP server whose /metrics counters stand
still or advance per read; SIGTERM and a crash are proven on the real `run_canary` in a child process.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from deploykit.canary import defaults
from deploykit.canary.progress import (
    ITERATION_HISTOGRAM,
    QUEUE_GAUGES,
    SLEEP_GAUGE,
    TOKEN_COUNTERS,
    WEIGHT_UPDATES_GAUGE,
    ProgressReading,
    ProgressWatch,
    read_progress,
)
from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.runtime import CanaryRuntime
from deploykit.canary.server_page import read_page
from deploykit.canary.settings import SETTINGS, CanarySettings
from deploykit.canary.state import CanaryState
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
from deploykit.smoke import CaseResult, SmokeReport, summarise
from tests.cli_process import PythonProcess, start_python
from tests.http_server import serving

GOOD = summarise(
    [CaseResult(name="c", kind="completion", endpoint="/v1/completions", model="m", passed=True)]
)
MISS = summarise(
    [
        CaseResult(
            name="c",
            kind="completion",
            endpoint="/v1/completions",
            model="m",
            passed=False,
            miss=True,
            diagnosis="timeout: no answer within 5 s",
        )
    ]
)


def page(tokens: float, running: float = 0, waiting: float = 0) -> str:
    """A /metrics page shaped like vLLM 0.32's (two engines' series; a _created sample)."""
    return "\n".join(
        [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}',
            'vllm:num_requests_running{engine="1",model_name="m"} 0.0',
            "# TYPE vllm:num_requests_waiting gauge",
            f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}',
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {tokens}',
            'vllm:generation_tokens_total{engine="1",model_name="m"} 5.0',
            'vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e+09',
            "# TYPE vllm:prompt_tokens_total counter",
            'vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0',
            "",
        ]
    )


def test_the_metric_names_are_the_installed_vllms() -> None:
    """The names read are the ones vLLM 0.32 registers (its source, read without importing vLLM)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = (Path(spec.origin).parent / "v1" / "metrics" / "loggers.py").read_text(encoding="utf-8")
    for name in (*TOKEN_COUNTERS, *QUEUE_GAUGES, ITERATION_HISTOGRAM, SLEEP_GAUGE):
        assert f'name="{name}"' in source, name
    online = Path(spec.origin).parent / "entrypoints" / "rl" / "online" / "metrics.py"
    assert f'"{WEIGHT_UPDATES_GAUGE}"' in online.read_text(encoding="utf-8")


def test_read_progress_sums_engines_and_needs_the_token_counters() -> None:
    reading = read_progress(page(10, running=2, waiting=1))
    assert reading is not None and (reading.tokens, reading.queued) == (115.0, 3.0)
    assert reading.engines == (("0", 110.0, 3.0), ("1", 5.0, 0.0))  # per engine: work, requests on it
    assert read_progress("# nothing of vLLM\nprocess_start_time_seconds 1.0\n") is None
    assert read_progress("vllm:generation_tokens_total{ 12\n") is None  # unparsable: nothing judged


# --- the judgement, on explicit times ----------------------------------------------------------------


def test_busy_is_not_hung_while_tokens_advance() -> None:
    watch = ProgressWatch()
    for second in range(0, 600, 2):  # ten minutes of a full queue, tokens advancing every read
        watch.observe(ProgressReading(tokens=float(second), queued=8), float(second))
        assert (watch.stalled_for(float(second)) or 0.0) < 2.0


def test_a_stalled_queue_is_measured_from_the_last_token() -> None:
    watch = ProgressWatch()
    watch.observe(ProgressReading(tokens=50, queued=0), 0.0)
    assert watch.stalled_for(30.0) is None  # nothing waits: an idle server is not hung
    watch.observe(ProgressReading(tokens=50, queued=1), 40.0)
    watch.observe(ProgressReading(tokens=50, queued=1), 100.0)
    assert watch.stalled_for(100.0) == 60.0  # waiting since 40 s, no token since
    watch.observe(ProgressReading(tokens=51, queued=1), 102.0)
    assert watch.stalled_for(102.0) == 0.0
    watch.forget()  # a failed read: nothing known
    assert watch.stalled_for(200.0, canary_waiting_since=0.0) is None


def test_the_canarys_own_waiting_request_counts_when_the_engine_never_reported_it() -> None:
    """The step that hangs never publishes its gauges: vLLM's queue reads 0 while the canary waits."""
    watch = ProgressWatch()
    watch.observe(ProgressReading(tokens=50, queued=0), 0.0)
    watch.observe(ProgressReading(tokens=50, queued=0), 70.0)
    assert watch.stalled_for(70.0, canary_waiting_since=5.0) == 65.0


def make_canary(tmp_path: Path, **config: Any) -> Canary:
    settings = {name: config.pop(name) for name in SETTINGS if name in config}
    return Canary(
        CanaryConfig(
            endpoint=Endpoint("http://127.0.0.1:1"),
            served_name="m",
            cases=[SmokeCase(kind="completion")],
            settings=CanarySettings(**settings),
            store=False,
            verdict_file=str(tmp_path / "verdict.json"),
            **config,
        ),
        runner=lambda *a, **k: GOOD,
    )


def test_hung_after_the_bound_then_a_passing_run_clears_it(tmp_path: Path) -> None:
    canary = make_canary(tmp_path, hung_after_s=60.0)
    told: list[str] = []
    canary.on_hung = told.append
    canary.observe_progress(ProgressReading(tokens=9, queued=2), now=0.0)
    assert canary.observe_progress(ProgressReading(tokens=9, queued=2), now=59.0) is None
    assert canary.observe_progress(ProgressReading(tokens=9, queued=2), now=60.5) == "hung"
    assert canary.state.status == "hung" and told and "waited 60 s with no token" in told[0]
    assert canary.health()[0] is False
    alive, why = canary.liveness()
    assert not alive and why.startswith("hung: the engine is hung")
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["status"] == "hung" and verdict["run_id"] == canary.run_id
    assert canary.metrics.hung._value.get() == 1  # the gauge says it too
    assert canary.run_once().outcome == "pass" and canary.state.status == "healthy"


def test_reads_that_fail_under_load_do_not_restart_the_clock_of_a_hang(tmp_path: Path) -> None:
    """A /metrics read that times out on a loaded machine is no reading: the last good one stands (the
    counters only grow within one process), so a hang is still told at its bound, not a minute late."""
    canary = make_canary(tmp_path, hung_after_s=60.0)
    canary.observe_progress(ProgressReading(tokens=9, queued=2), now=0.0)
    for second in range(2, 60, 2):  # every read between fails
        assert canary.observe_progress(None, now=float(second)) is None
    assert canary.observe_progress(ProgressReading(tokens=9, queued=2), now=60.5) == "hung"


def test_a_canary_run_that_waits_out_its_deadline_counts_toward_hung(tmp_path: Path) -> None:
    """vLLM's queue gauges read 0 (the hung step never published them); the canary's own request waits."""
    canary = make_canary(tmp_path, hung_after_s=60.0, timeout_s=5.0)
    entered, release = threading.Event(), threading.Event()

    def runner(*args: Any, **kwargs: Any) -> SmokeReport:
        entered.set()
        release.wait(30)
        return MISS

    canary.runner = runner
    canary.observe_progress(ProgressReading(tokens=9, queued=0), now=time.monotonic())
    thread = threading.Thread(target=canary.run_once)
    thread.start()
    assert entered.wait(30)
    assert canary._run_since is not None
    later = canary._run_since + 61.0
    assert canary.observe_progress(ProgressReading(tokens=9, queued=0), now=later) == "hung"
    release.set()
    thread.join(30)
    assert canary.state.status == "hung"  # the miss that followed keeps it


def test_corruption_beats_hung_and_a_restart_clears_hung() -> None:
    state = CanaryState()
    assert state.observe_hung("stuck") == "hung"
    assert state.observe("c", "miss", "timeout") is None and state.status == "hung"  # not `unreachable`
    assert state.observe("c", "wrong", "id 0") == "corrupt"
    assert state.observe_hung("stuck") is None and state.status == "corrupt"
    state = CanaryState()
    state.observe_hung("stuck")
    assert state.restarted() == "starting"


def test_hung_off_with_a_zero_bound(tmp_path: Path) -> None:
    canary = make_canary(tmp_path, hung_after_s=0.0, metrics_every_s=0.0)
    assert not canary.config.reads_page
    canary.observe_progress(ProgressReading(tokens=9, queued=2), now=0.0)
    assert canary.observe_progress(ProgressReading(tokens=9, queued=2), now=1e6) is None


# --- the poller against a real HTTP server ------------------------------------------------------------


class MetricsPage(BaseHTTPRequestHandler):
    """vLLM's /metrics: tokens stand still (`advance` 0) or grow by `advance` on every read."""

    advance = 0
    reads = 0

    def do_GET(self) -> None:
        cls = type(self)
        cls.reads += 1
        body = page(tokens=float(cls.reads * cls.advance), running=3).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


@pytest.mark.parametrize("advance", [0, 1])
def test_the_poller_tells_hung_from_busy_on_a_real_server(tmp_path: Path, advance: int) -> None:
    handler = type("Page", (MetricsPage,), {"advance": advance, "reads": 0})
    with serving(handler) as url:
        canary = make_canary(tmp_path, hung_after_s=0.5, progress_every_s=0.05, metrics_every_s=0.0)
        canary.config.endpoint = Endpoint(url)
        runtime = CanaryRuntime(canary)
        runtime.start(runs=False)
        # Reads, not time: enough of them to span the bound several times over.
        deadline = time.monotonic() + 60
        while handler.reads < 40 and time.monotonic() < deadline and canary.state.status != "hung":
            time.sleep(0.05)
        if advance == 0:
            while canary.state.status != "hung" and time.monotonic() < deadline:
                time.sleep(0.05)
        runtime.close()
    assert canary.state.status == ("hung" if advance == 0 else "starting")


def test_the_poller_reads_a_capped_page(tmp_path: Path) -> None:
    class Huge(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            chunk = b"# padding " + b"x" * 65536 + b"\n"
            try:
                for _ in range(200):  # 13 MB, over the 8 MiB cap
                    self.wfile.write(chunk)
            except OSError:
                return

        def log_message(self, format: str, *args: Any) -> None:
            return

    with serving(Huge) as url:
        page = read_page(Endpoint(url, metrics_deadline_s=10))
    assert page.too_big and page.progress is None and page.nan is None


# --- a stuck or dead canary ----------------------------------------------------------------------------


def test_livez_fails_when_a_run_is_stuck_or_runs_stop(tmp_path: Path) -> None:
    canary = make_canary(tmp_path, timeout_s=5.0, every_s=60.0)
    start = canary._last_beat
    assert canary.stuck(start + 60) is None
    assert canary.stuck(start + 60 + 5 + defaults.RUN_GRACE_S + 1) is not None  # no run came
    canary._run_since, canary._run_deadline = start, start + 50.0
    assert canary.stuck(start + 49) is None
    assert "has not ended after 51 s (stuck)" in (canary.stuck(start + 51) or "")
    canary._run_deadline = time.monotonic() - 1  # the real clock: /livez says it
    alive, why = canary.liveness()
    assert not alive and "(stuck)" in why


# Runs `run_canary` in a child process with a runner that blocks (mode "block") or raises (mode "crash").
RUN_CANARY = """
import sys, threading
from pathlib import Path
from deploykit.canary import command as module
from deploykit.canary.settings import CanarySettings
from deploykit.profile.schema import SmokeCase
from deploykit.smoke import CaseResult, summarise

mode, verdict, marker = sys.argv[1], sys.argv[2], Path(sys.argv[3])
good = summarise(
    [CaseResult(name="c", kind="completion", endpoint="/v1/completions", model="m", passed=True)]
)
runs = []

def runner(endpoint, requests, **kwargs):
    runs.append(1)
    if len(runs) == 2:
        marker.write_text("in the second run")
        if mode == "crash":
            raise TypeError("an answer nobody expected")
        threading.Event().wait()  # a request that never ends
    return good

real_canary = module.Canary
module.Canary = lambda config, **kw: real_canary(config, runner=runner, **kw)
from deploykit.endpoint import Endpoint
module.build_config = lambda options: module.CanaryConfig(
    endpoint=Endpoint(options.url), served_name="m", cases=[SmokeCase(kind="completion")],
    settings=options.settings.replace(every_s=0.1), store=False,
    verdict_file=options.verdict_file, hung_after_s=0,
)
options = module.CanaryOptions(
    url="http://127.0.0.1:1", settings=CanarySettings(listen="127.0.0.1:0"), store=False,
    watch_restarts=False, verdict_file=verdict,
)
sys.exit(module.run_canary(options))
"""


def _start(tmp_path: Path, mode: str) -> tuple[PythonProcess, Path, Path]:
    verdict, marker = tmp_path / "verdict.json", tmp_path / "marker"
    child = start_python(  # forked from a warm interpreter: tests/cli_process.py
        ["-c", RUN_CANARY, mode, str(verdict), str(marker)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return child, verdict, marker


def _wait_for(path: Path, child: PythonProcess) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_sigterm_mid_request_stops_the_canary_within_seconds(tmp_path: Path) -> None:
    child, verdict, marker = _start(tmp_path, "block")
    try:
        _wait_for(marker, child)
        assert json.loads(verdict.read_text())["status"] == "healthy"  # the first run passed
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        _out, err = child.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert took < 5.0, took  # within seconds, though the run's request never ends
    final = json.loads(verdict.read_text())
    assert final["status"] == "unknown" and final["final"] is True  # never left `healthy`
    assert final["diagnosis"] == "the canary stopped (SIGTERM received): nothing judges the server now"


def test_a_crash_writes_a_final_verdict_that_is_not_healthy(tmp_path: Path) -> None:
    child, verdict, _marker = _start(tmp_path, "crash")
    try:
        _out, _err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0
    final = json.loads(verdict.read_text())
    assert final["status"] == "unknown" and final["final"] is True
    assert final["diagnosis"] == "the canary crashed: TypeError: an answer nobody expected"


# --- steps count, and an engine quiet on purpose is not hung (issue 45) -------------------------------


def quiet_page(tokens: float, steps: float = 0, awake: int = 1, updates: int = 0) -> str:
    """`page` with vLLM 0.32's iteration histogram, sleep-state gauge and weight-update gauge."""
    labels = 'engine="0",model_name="m"'
    return page(tokens, running=1) + "\n".join(
        [
            "# TYPE vllm:iteration_tokens_total histogram",
            f'vllm:iteration_tokens_total_bucket{{engine="0",le="+Inf",model_name="m"}} {steps}',
            f'vllm:iteration_tokens_total_count{{engine="0",model_name="m"}} {steps}',
            f'vllm:iteration_tokens_total_sum{{engine="0",model_name="m"}} {steps * 64}',
            "# TYPE vllm:engine_sleep_state gauge",
            f'vllm:engine_sleep_state{{{labels},sleep_state="awake"}} {awake}',
            f'vllm:engine_sleep_state{{{labels},sleep_state="weights_offloaded"}} {1 - awake}',
            "# TYPE vllm:rl_weight_update_operations_in_flight gauge",
            f"vllm:rl_weight_update_operations_in_flight {updates}",
            "",
        ]
    )


def test_read_progress_reads_steps_sleep_and_weight_updates() -> None:
    reading = read_progress(quiet_page(10, steps=3))
    assert reading is not None and reading.steps == 3 + 3 * 64 and reading.quiet_on_purpose is None
    asleep = read_progress(quiet_page(10, awake=0))
    assert asleep is not None and asleep.asleep and "sleeps" in (asleep.quiet_on_purpose or "")
    loading = read_progress(quiet_page(10, updates=1))
    assert loading is not None and loading.reloading and "weights" in (loading.quiet_on_purpose or "")


def test_a_long_prefill_whose_steps_advance_is_not_hung(tmp_path: Path) -> None:
    """A long prompt's prefill chunks move no token counter until its first token: each chunk is an engine
    step, and vLLM's iteration histogram counts it. Without the steps this read as hung at 60 s."""
    canary = make_canary(tmp_path, hung_after_s=60.0)
    for second in range(0, 300, 2):
        reading = read_progress(quiet_page(tokens=100, steps=second))
        assert canary.observe_progress(reading, now=float(second)) is None
    assert canary.state.status == "starting"
    without_steps = make_canary(tmp_path, hung_after_s=60.0)
    statuses = [
        without_steps.observe_progress(read_progress(quiet_page(tokens=100, steps=0)), now=float(second))
        for second in range(0, 300, 2)
    ]
    assert "hung" in statuses  # the same reads, steps standing still: hung


@pytest.mark.parametrize("quiet", ["asleep", "reloading", "paused"])
def test_an_engine_quiet_on_purpose_is_not_hung_and_the_clock_starts_when_it_wakes(
    tmp_path: Path, quiet: str
) -> None:
    canary = make_canary(tmp_path, hung_after_s=60.0)
    kwargs = {"asleep": {"awake": 0}, "reloading": {"updates": 1}, "paused": {}}[quiet]
    for second in range(0, 600, 2):  # ten minutes asleep / loading / paused, requests queued
        reading = read_progress(quiet_page(tokens=50, steps=5, **kwargs))
        assert canary.observe_progress(reading, now=float(second), paused=quiet == "paused") is None
    awake = read_progress(quiet_page(tokens=50, steps=5))
    assert canary.observe_progress(awake, now=630.0) is None  # 30 s after it woke: not yet
    assert canary.observe_progress(awake, now=660.5) == "hung"  # woke at 598 s, nothing done since


class PausablePage(BaseHTTPRequestHandler):
    """vLLM in development mode: /metrics standing still, /is_paused saying `paused` (404 without it)."""

    paused: bool | None = True
    asked = 0

    def do_GET(self) -> None:
        cls = type(self)
        if self.path == "/is_paused":
            cls.asked += 1
            if cls.paused is None:
                self.send_error(404)
                return
            body = json.dumps({"is_paused": cls.paused}).encode()
        else:
            body = quiet_page(tokens=7, steps=2).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_is_paused_is_asked_only_while_the_counters_stand_still_and_never_without_the_route() -> None:
    from deploykit.canary.server_page import PageReader

    paused = type("Paused", (PausablePage,), {"paused": True, "asked": 0})
    with serving(paused) as url:
        reader = PageReader()
        pages = [reader.read(Endpoint(url)) for _ in range(3)]
    assert [page.paused for page in pages] == [False, True, True] and paused.asked == 2
    routeless = type("Routeless", (PausablePage,), {"paused": None, "asked": 0})
    with serving(routeless) as url:
        reader = PageReader()
        pages = [reader.read(Endpoint(url)) for _ in range(4)]
    assert not any(page.paused for page in pages) and routeless.asked == 1  # a 404 once, then never


def test_the_server_start_time_is_exported_from_its_first_reading_only(tmp_path: Path) -> None:
    """The restart-cap alert counts its changes (`changes()`): a 0 before the first reading would count."""
    from deploykit.canary.server_page import ServerPage

    canary = make_canary(tmp_path, hung_after_s=60.0)
    assert b"server_start_timestamp" not in canary.metrics.text()
    reading = read_progress(quiet_page(tokens=1) + "process_start_time_seconds 1.7966e+09\n")
    assert reading is not None and reading.started == 1.7966e9
    canary.take_page(ServerPage(progress=reading))
    assert b"deploykit_canary_server_start_timestamp_seconds 1.7966e+09" in canary.metrics.text()


def two_engines(busy_tokens: float, wedged_tokens: float) -> str:
    """Data parallel: engine 0 busy and advancing, engine 1 with two requests and counters still."""
    return "\n".join(
        [
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="m"} 8.0',
            'vllm:num_requests_running{engine="1",model_name="m"} 2.0',
            "# TYPE vllm:generation_tokens_total counter",
            f'vllm:generation_tokens_total{{engine="0",model_name="m"}} {busy_tokens}',
            f'vllm:generation_tokens_total{{engine="1",model_name="m"}} {wedged_tokens}',
            "",
        ]
    )


def test_one_wedged_engine_among_busy_ones_is_hung(tmp_path: Path) -> None:
    """Summed over engines the counters advance every read; engine 1's own stand still while its requests
    wait. Judged on the sum alone (what the canary did before) this was never `hung`."""
    canary = make_canary(tmp_path, hung_after_s=60.0)
    statuses = [
        canary.observe_progress(
            read_progress(two_engines(busy_tokens=100.0 + second, wedged_tokens=40.0)), now=second
        )
        for second in range(0, 70, 2)
    ]
    assert "hung" in statuses and statuses.index("hung") == 30  # the read at 60 s: the bound
    summed = ProgressWatch()
    for second in range(0, 70, 2):
        reading = read_progress(two_engines(busy_tokens=100.0 + second, wedged_tokens=40.0))
        assert reading is not None
        summed.observe(ProgressReading(tokens=reading.tokens, queued=reading.queued), float(second))
    assert (summed.stalled_for(68.0) or 0.0) < 60.0  # the sum alone says busy
