"""The canary never harms the server it watches (issue 34): an answer that refuses the canary's own request
(HTTP 400 too long, 401/403 a key, 404 a name, 413, 422) is `misconfigured`, not `corrupt`; the pod's probes
pass on it; with `--keep-running` the canary never ends on its own trouble (a refused key, a profile it
cannot read, a crash or a stuck run of its own) and picks a rotated key up from `--api-key-file`.

Over real loopback HTTP against the hostile server (tests/smoke/hostile_server.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from deploykit.canary import defaults
from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.runtime import run_loop, run_stoppable
from deploykit.canary.settings import SETTINGS, CanarySettings
from deploykit.endpoint import Endpoint
from deploykit.profile.schema import SmokeCase
from deploykit.render.pod_probe import decide
from deploykit.smoke import CaseResult, SmokeReport, summarise
from tests.cli_process import PythonProcess, start_python
from tests.smoke.hostile_server import MODEL, Hostile

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 120.0


def canary_for(url: str, tmp_path: Path, **changes: Any) -> Canary:
    config = CanaryConfig(
        endpoint=Endpoint(url),
        served_name=MODEL,
        cases=[SmokeCase(kind="completion")],
        settings=CanarySettings(timeout_s=5.0, metrics_every_s=0),
        store=False,
        verdict_file=str(tmp_path / "verdict.json"),
        **changes,
    )
    return Canary(config)


def probes_on(verdict_path: Path) -> tuple[bool, bool]:
    """(live, ready) of the pod's probes on this verdict, vLLM's /health fine, the verdict fresh."""
    verdict = json.loads(verdict_path.read_text())
    mtime = verdict_path.stat().st_mtime
    results = [
        decide(mode, health_ok=True, verdict=verdict, verdict_mtime=mtime, process_start=0.0, now=mtime + 1)
        for mode in ("live", "ready")
    ]
    return results[0].passed, results[1].passed


@pytest.mark.parametrize("mode", ["http-400", "http-401", "http-403", "http-404", "http-413", "http-422"])
def test_a_refused_request_is_misconfigured_not_corrupt_and_probes_pass(mode: str, tmp_path: Path) -> None:
    with Hostile(mode).serving() as url:
        canary = canary_for(url, tmp_path)
        runs = [canary.run_once() for _ in range(2)]
        alive = canary.liveness()
    assert [run.outcome for run in runs] == ["misconfigured", "misconfigured"], runs[0].report.diagnosis
    assert canary.state.misconfigured and not canary.state.corrupt
    assert not canary.health()[0]  # never healthy: nothing was judged
    assert alive[0], alive  # the canary's /livez does not ask for a restart of vLLM
    verdict = json.loads((tmp_path / "verdict.json").read_text())
    assert verdict["status"] == "misconfigured" and f"HTTP {mode[5:]}" in verdict["diagnosis"]
    assert probes_on(tmp_path / "verdict.json") == (True, True)
    assert canary.metrics.misconfigured._value.get() == 1


def test_a_400_that_says_nan_stays_corruption(tmp_path: Path) -> None:
    """vLLM answers 400 when it cannot encode NaN logprobs: that is the output, not the setup."""
    with Hostile("http-400-nan").serving() as url:
        canary = canary_for(url, tmp_path)
        run = canary.run_once()
    assert run.outcome == "wrong" and canary.state.corrupt
    assert probes_on(tmp_path / "verdict.json") == (False, False)


def test_corrupt_stays_corrupt_through_a_misconfigured_run_and_a_pass_clears_misconfigured(
    tmp_path: Path,
) -> None:
    with Hostile("id-infinity").serving() as url:
        canary = canary_for(url, tmp_path)
        canary.run_once()
    with Hostile("http-401").serving() as url:
        canary.config.endpoint = Endpoint(url)
        canary.run_once()
    assert canary.state.corrupt  # a refused key hides no corruption
    fresh = canary_for("http://127.0.0.1:1", tmp_path)
    with Hostile("http-404").serving() as url:
        fresh.config.endpoint = Endpoint(url)
        fresh.run_once()
    with Hostile("good").serving() as url:
        fresh.config.endpoint = Endpoint(url)
        fresh.run_once()
    assert fresh.state.status == "healthy"


def test_a_rotated_key_is_read_again_from_the_key_file(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("old-key\n")  # a trailing line break, as `kubectl create secret --from-file` keeps
    hostile = Hostile("good", api_keys={"old-key"})
    with hostile.serving() as url:
        canary = canary_for(url, tmp_path, api_key_file=str(key_file))
        outcomes = []
        for server_keys, file_key in [(None, None), ({"new-key"}, None), (None, "new-key")]:
            if server_keys is not None:
                hostile.api_keys = server_keys  # the server restarted with the rotated Secret
            if file_key is not None:
                key_file.write_text(file_key)  # the kubelet updated the mounted Secret
            canary.refresh_api_key()
            outcomes.append((canary.run_once().outcome, canary.state.status))
    assert outcomes == [
        ("pass", "healthy"),
        ("misconfigured", "misconfigured"),
        ("pass", "healthy"),
    ]


def test_the_key_file_is_refused_in_one_line_without_its_value(tmp_path: Path) -> None:
    from deploykit.canary.api_key import read_api_key_file
    from deploykit.errors import CanaryError

    bad = [(b"", "is empty"), (b"se\x01cret", "control character"), (b"s\xc3\xa9", "non-ASCII")]
    for content, words in bad:
        path = tmp_path / "key"
        path.write_bytes(content)
        with pytest.raises(CanaryError) as caught:
            read_api_key_file(str(path))
        assert words in str(caught.value) and "secret" not in str(caught.value)
    with pytest.raises(CanaryError, match="cannot be read"):
        read_api_key_file(str(tmp_path / "missing"))


GOOD = summarise(
    [CaseResult(name="c", kind="completion", endpoint="/v1/completions", model="m", passed=True)]
)


def scripted(tmp_path: Path, runner: Any, keep_running: bool, **changes: Any) -> Canary:
    settings = {name: changes.pop(name) for name in SETTINGS if name in changes}
    config = CanaryConfig(
        endpoint=Endpoint("http://127.0.0.1:1"),
        served_name="m",
        cases=[SmokeCase(kind="completion")],
        settings=CanarySettings(every_s=0.1, metrics_every_s=0, **settings),
        store=False,
        hung_after_s=0,
        verdict_file=str(tmp_path / "verdict.json"),
        keep_running=keep_running,
        **changes,
    )
    return Canary(config, runner=runner)


def test_a_crash_of_the_canary_s_own_run_is_misconfigured_with_keep_running(tmp_path: Path) -> None:
    calls: list[int] = []
    stop = threading.Event()

    def runner(endpoint: Endpoint, requests: Any, **kwargs: Any) -> SmokeReport:
        calls.append(1)
        if len(calls) == 1:
            raise TypeError("an answer nobody expected")
        stop.set()
        return GOOD

    with pytest.raises(TypeError):
        run_loop(scripted(tmp_path, runner, keep_running=False), threading.Event())
    calls.clear()
    seen: list[str] = []
    canary = scripted(tmp_path, runner, keep_running=True)
    canary.on_warning = seen.append
    run_loop(canary, stop, keep_running=True)
    assert len(calls) == 2  # the loop went on after the crash
    assert any("MISCONFIGURED: the canary's own run failed (TypeError" in line for line in seen), seen
    assert canary.state.status == "healthy"  # the next run passed


def test_a_run_stuck_in_the_canary_is_abandoned_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(defaults, "RUN_GRACE_S", 0.0)
    release = threading.Event()

    def runner(endpoint: Endpoint, requests: Any, **kwargs: Any) -> SmokeReport:
        release.wait(60)  # a run that ignores its own deadline (a bug of the canary's)
        return GOOD

    canary = scripted(tmp_path, runner, keep_running=True, timeout_s=0.1)
    started = time.monotonic()
    run_stoppable(canary, threading.Event())
    took = time.monotonic() - started
    release.set()
    assert took < 30, took
    assert canary.state.misconfigured and "abandoned" in canary.state.diagnosis
    assert canary.stuck() is None  # /livez no longer waits on the abandoned run


def _poll_verdict(path: Path, child: PythonProcess, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        assert child.poll() is None, child.communicate()
        try:
            verdict: dict[str, Any] = json.loads(path.read_text())
            if verdict["status"] == status:
                return verdict
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline, f"no {status} verdict in {WAIT_S:g} s"
        time.sleep(0.1)


def test_the_command_with_keep_running_never_exits_on_a_refused_key_and_heals_on_rotation(
    tmp_path: Path,
) -> None:
    """`deploykit canary --keep-running --exit-on-corruption` (the units' and chart's canary) against a
    server that refuses its key: it stays up saying `misconfigured` (never exit 3, which restarts the
    server), takes the right key from the file once it is there, then a rotation heals the same way."""
    verdict, key_file = tmp_path / "verdict.json", tmp_path / "key"
    key_file.write_text("stale-key")
    hostile = Hostile("good-counting", api_keys={"key-1"})
    with hostile.serving() as url:
        argv = ["-m", "deploykit", "canary", "--url", url, "--model", MODEL]
        argv += ["--keep-running", "--exit-on-corruption", "--api-key-file", str(key_file), "--no-store"]
        argv += ["--every", "0.2", "--metrics-every", "0", "--listen", "127.0.0.1:0"]
        argv += ["--verdict-file", str(verdict), "--no-watch-restarts"]
        child = start_python(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # forked
        try:
            first = _poll_verdict(verdict, child, "misconfigured")
            assert "HTTP 401" in first["diagnosis"] and "tries again" in first["diagnosis"]
            key_file.write_text("key-1")
            _poll_verdict(verdict, child, "healthy")
            hostile.api_keys = {"key-2"}  # the server took the rotated key; the file still has key-1
            rotated = _poll_verdict(verdict, child, "misconfigured")
            assert "HTTP 401" in rotated["diagnosis"]
            key_file.write_text("key-2\n")
            _poll_verdict(verdict, child, "healthy")
            child.send_signal(signal.SIGTERM)
            out, err = child.communicate(timeout=60)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert child.returncode == 0, err  # never 3: nothing restarted the server
    assert "MISCONFIGURED" in err and "key-1" not in err + out and "key-2" not in err + out
    # The systemd unit's ExecStopPost= on that ending: the server is left alone.
    from deploykit.render.on_corruption import main as on_corruption

    commands: list[list[str]] = []

    def run(command: list[str]) -> int:
        commands.append(command)
        return 0

    ended = {"EXIT_CODE": "exited", "EXIT_STATUS": str(child.returncode)}
    assert on_corruption(["--restart", "deploykit-x.service"], env=ended, run=run) == 0
    assert commands == []


def test_the_command_with_keep_running_waits_out_a_profile_it_cannot_read(tmp_path: Path) -> None:
    verdict, profile = tmp_path / "verdict.json", tmp_path / "profile.yaml"
    profile.write_text("name: [not a profile\n")
    argv = ["-m", "deploykit", "canary", "--url", "http://127.0.0.1:1", "--profile"]
    argv += [str(profile), "--keep-running", "--every", "0.2", "--listen", "127.0.0.1:0", "--no-store"]
    argv += ["--verdict-file", str(verdict)]
    child = start_python(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # forked
    try:
        found = _poll_verdict(verdict, child, "misconfigured")
        assert "cannot be set up" in found["diagnosis"] and str(profile) in found["diagnosis"]
        assert child.poll() is None
        child.send_signal(signal.SIGTERM)
        _out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert err.count("MISCONFIGURED") == 1, err  # one line per reason, not one per try


def test_a_first_run_long_after_the_canary_was_made_is_not_abandoned(tmp_path: Path) -> None:
    """serve makes its canary, then waits minutes for vLLM before the first run: the loop must not take
    that wait for a stuck run (the run's thread may not have registered yet when the loop first looks)."""
    canary = scripted(tmp_path, lambda endpoint, requests, **kwargs: GOOD, keep_running=True)
    canary.abandon_run()  # (sets the last beat)
    canary._last_beat -= 3600.0  # made an hour ago
    assert canary.stuck() is not None  # /livez: the runs stopped coming
    assert canary.stuck(run_only=True) is None  # the loop: no run of its own is overdue
    run_stoppable(canary, threading.Event())
    assert canary.state.status == "healthy", canary.state.diagnosis
