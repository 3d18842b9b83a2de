"""The canary against a hostile or broken server (issue 31), over real loopback HTTP (tests/smoke/
hostile_server.py): an odd answer is a `wrong` run and the canary goes on (it used to exit 1 on a token id
`Infinity`), a trickle or a hang is a `miss` at the request's deadline, and vLLM's NaN counter is read as
a counter (backwards is a reset, an exemplar is not the value) from a page no bigger than its cap.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from deploykit.canary.nan_counter import NanCounterFollower
from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.server_page import read_page
from deploykit.canary.settings import CanarySettings
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
from tests.cli_process import PythonProcess, run_deploykit, start_python
from tests.smoke.hostile_server import HOSTILE_TEXT, MODEL, SHOWN_ESCAPED, Hostile, acted_on

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 1.0  # four trickled bytes (TRICKLE_EVERY_S): a per-read timeout never ends it
DEADLINE_SLACK_S = 8.0
METRICS_RSS_CAP_MIB = 64


def canary_for(url: str) -> Canary:
    config = CanaryConfig(
        endpoint=Endpoint(url),
        served_name=MODEL,
        cases=[SmokeCase(kind="completion")],
        settings=CanarySettings(timeout_s=DEADLINE_S, metrics_every_s=0),
        store=False,
    )
    return Canary(config)


@pytest.mark.parametrize(
    "mode",
    [
        "text-as-number",
        "completion-tokens-as-string",
        "id-infinity",
        "id-10e30",
        "id-float",
        "id-true",
        "id-string",
        "no-logprobs",
        "nan-as-string",
    ],
)
def test_an_odd_answer_is_a_wrong_run_and_the_canary_goes_on(mode: str) -> None:
    with Hostile(mode).serving() as url:
        canary = canary_for(url)
        runs = [canary.run_once() for _ in range(2)]
    assert [run.outcome for run in runs] == ["wrong", "wrong"], [r.report.diagnosis for r in runs]
    assert canary.state.corrupt and not canary.health()[0]


def test_the_good_answer_of_the_same_server_passes() -> None:
    with Hostile("good").serving() as url:
        run = canary_for(url).run_once()
    assert run.outcome == "pass", run.report.diagnosis


@pytest.mark.parametrize("mode", ["trickle", "hang-after-headers", "hang-before-headers"])
def test_a_trickle_or_a_hang_is_a_miss_at_the_deadline(mode: str) -> None:
    with Hostile(mode).serving() as url:
        canary = canary_for(url)
        started = time.monotonic()
        run = canary.run_once()
        took = time.monotonic() - started
    assert run.outcome == "miss" and took < DEADLINE_S + DEADLINE_SLACK_S, (run.report.diagnosis, took)


def test_the_first_look_and_the_health_check_end_at_their_deadlines() -> None:
    """The canary's first look at /v1/models ("10 s") hung for good on a server that trickled; so did
    every /health check (`/livez`, the restart watcher)."""
    from deploykit.canary.discovery import served_models, server_health_ok

    with Hostile(slow_listing=True).serving() as url:
        started = time.monotonic()
        assert served_models(Endpoint(url), timeout_s=DEADLINE_S) is None  # no answer in time: not vLLM yet
        assert not server_health_ok(Endpoint(url), DEADLINE_S)
        took = time.monotonic() - started
    assert took < 2 * DEADLINE_S + DEADLINE_SLACK_S, took


def poll(hostile: Hostile, reads: int) -> tuple[list[float], list[str]]:
    grown: list[float] = []
    warnings: list[str] = []
    with hostile.serving() as url:
        follower = NanCounterFollower(on_warning=warnings.append)
        grown = [follower.take(read_page(Endpoint(url)).nan) for _ in range(reads)]
    return grown, warnings


def test_a_counter_going_backwards_is_a_reset_not_nan_requests() -> None:
    """10, 9, 8, 7 in one process (`_created` unchanged) read as "9 more request(s) with NaN logits"."""
    grown, warnings = poll(Hostile(metrics_totals=[10, 9, 8, 7, 8]), 5)
    assert grown == [0, 0, 0, 0, 1]
    resets = [w for w in warnings if "went down" in w]
    assert len(resets) == 3 and "taken as a reset of the counter" in resets[0], warnings


def test_an_exemplar_after_the_value_is_not_the_value() -> None:
    grown, _ = poll(Hostile(metrics_totals=[1, 3], exemplar=True), 2)
    assert grown == [0, 2]  # the exemplar's 99 would have made it 98


METRICS_CHILD = """
import json, resource, sys, time
from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.server_page import read_page
from deploykit.canary.settings import CanarySettings
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
warnings = []
config = CanaryConfig(
    endpoint=Endpoint(sys.argv[1]), served_name="m", cases=[SmokeCase(kind="completion")],
    settings=CanarySettings(metrics_every_s=2), store=False, hung_after_s=0,
)
canary = Canary(config, on_warning=warnings.append)
endpoint = Endpoint(sys.argv[1], metrics_deadline_s=30)
started = time.monotonic()
grown = []
for _ in range(3):
    before = canary.metrics.live_nan._value.get()
    canary.take_page(read_page(endpoint))
    grown.append(canary.metrics.live_nan._value.get() - before)
print(json.dumps({
    "grown": grown, "warnings": warnings, "took": time.monotonic() - started,
    "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def metrics_child(url: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", METRICS_CHILD, url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    return dict(json.loads(result.stdout))


def test_a_300_mb_metrics_page_is_read_to_its_cap_only() -> None:
    """A 300 MB /metrics page took the canary to 4.3 GB, re-read every 2 s. Now each read stops at the
    8 MiB metrics cap: no growth, one warning for all the reads, and a peak RSS within METRICS_RSS_CAP_MIB
    of the same child's on a normal page."""
    with Hostile(metrics_totals=[0]).serving() as url:
        normal = metrics_child(url)
    with Hostile(metrics_flood=True).serving() as url:
        flooded = metrics_child(url)
    assert flooded["grown"] == [0, 0, 0], flooded
    capped = [w for w in flooded["warnings"] if "8 MiB cap" in w]
    assert len(capped) == 1, flooded["warnings"]
    print(
        f"300 MB /metrics: peak RSS {flooded['maxrss_mib']:.0f} MiB (normal page {normal['maxrss_mib']:.0f})"
    )
    assert flooded["maxrss_mib"] - normal["maxrss_mib"] < METRICS_RSS_CAP_MIB, (flooded, normal)


def read_lines(process: PythonProcess, count: int, within_s: float) -> list[str]:
    """The child's first `count` stdout lines that start with `run `, waiting at most `within_s`."""
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + within_s
    while len([line for line in lines if line.startswith("run ")]) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {lines} within {within_s} s"
        ready, _, _ = select.select([process.stdout], [], [], left)
        if ready:
            line = process.stdout.readline()
            assert line, f"the canary ended: {lines}"
            lines.append(line.rstrip("\n"))
    return lines


@pytest.mark.parametrize(("mode", "word", "runs"), [("id-infinity", "WRONG", 3), ("trickle", "miss", 1)])
def test_deploykit_canary_stays_up_and_stops_on_sigterm(mode: str, word: str, runs: int) -> None:
    """`deploykit canary` exited 1 on an id `Infinity` (the systemd unit restarted only the canary; in the
    chart it crash-looped while the probes passed), and a trickle held its run for good."""
    with Hostile(mode).serving() as url:
        argv = ["-m", "deploykit", "canary", "--url", url, "--model", MODEL, "--no-store"]
        # A trickle holds each run to its deadline (1 s keeps the test short); the id `Infinity` comes at
        # once, and a loaded machine must not turn it into a miss (5 s).
        timeout = "1" if mode == "trickle" else "5"
        argv += ["--every", "0.2", "--timeout", timeout, "--metrics-every", "0"]
        argv += ["--no-watch-restarts", "--listen", "127.0.0.1:0"]
        process = start_python(  # forked from a warm interpreter: tests/cli_process.py
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200"},
        )
        try:
            lines = read_lines(process, runs, within_s=60)
            assert process.poll() is None, "the canary died"
            runs = [line for line in lines if line.startswith("run ")]
            assert all(f": {word}" in line for line in runs), lines
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=1 + DEADLINE_SLACK_S + 15)
            stopped_in = time.monotonic() - started
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert process.returncode == 0 and "Traceback" not in stderr, stderr
    assert stopped_in < 1 + DEADLINE_SLACK_S, stopped_in  # a run in progress ends at its deadline


def test_a_model_id_and_answers_with_escape_sequences_are_shown_escaped() -> None:
    """The canary printed the model id the server lists (`canary for ID at ...`) and its error answers raw
    (issue 43): a clear screen and a green `verdict: PASS` from the server reached the terminal."""
    with Hostile("http-500-escapes", model=HOSTILE_TEXT).serving() as url:
        argv = ["-m", "deploykit", "canary", "--url", url, "--no-store", "--every", "0.2", "--timeout", "5"]
        argv += ["--metrics-every", "0", "--no-watch-restarts", "--listen", "127.0.0.1:0"]
        process = start_python(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=dict(os.environ)
        )
        try:
            lines = read_lines(process, 1, within_s=60)
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=DEADLINE_SLACK_S + 15)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        refused = run_deploykit(["canary", "--url", url, "--model", MODEL, "--no-store"], cwd=REPO)
    output = "\n".join(lines) + stderr
    assert acted_on(output) == [], output
    (started,) = [line for line in lines if line.startswith("canary for ")]
    assert all(part in started for part in SHOWN_ESCAPED), started
    assert all(part in "\n".join(lines) for part in SHOWN_ESCAPED[1:]), lines  # the run's diagnosis
    assert refused.returncode == 2 and acted_on(refused.stderr) == [], refused.stderr
    assert f"does not serve 'tiny'; it serves boom{SHOWN_ESCAPED[0]}" in refused.stderr, refused.stderr
