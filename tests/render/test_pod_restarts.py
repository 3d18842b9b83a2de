"""The pod's corruption-restart cap (issue 34, `deploykit.render.pod_restarts`): a model that turns corrupt
after every restart is restarted at most 3 times an hour, then left running out of the Service with the
reason in the probe's line. Through the real probe command (the standard library and the zipped package
only). A hung canary is its keeper's (tests/render/test_canary_keeper.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploykit.canary import defaults
from deploykit.render import pod_restarts
from tests.render.test_pod_probe import Pod, fake_proc, outcome, url_of, wheel_zip  # noqa: F401
from tests.render.test_pod_probe import pod as pod
from tests.render.test_pod_probe import vllm as vllm

NOW = 1_800_000_000.0


def test_the_pod_cap_is_the_systemd_cap() -> None:
    assert pod_restarts.MAX_RESTARTS == defaults.MAX_RESTARTS_PER_HOUR
    assert pod_restarts.WINDOW_S == defaults.RESTART_WINDOW_S


def test_each_corrupt_process_counts_once_and_the_fourth_is_held(tmp_path: Path) -> None:
    decisions = []
    for number in range(4):
        start = NOW + 600 * number  # a new vLLM process after each restart
        # The liveness probe fails 3 times before the kubelet acts: one restart, counted once.
        decisions += [pod_restarts.restart_or_hold(str(tmp_path), start, start + 60 + k)[0] for k in range(3)]
    assert decisions == [True] * 9 + [False] * 3
    assert pod_restarts.capped_reason(str(tmp_path), NOW + 1800, NOW + 1900) is not None
    assert pod_restarts.capped_reason(str(tmp_path), NOW + 1200, NOW + 1900) is None  # an earlier process


def test_the_window_forgets_old_restarts(tmp_path: Path) -> None:
    for number in range(3):
        assert pod_restarts.restart_or_hold(str(tmp_path), NOW + number, NOW + number)[0]
    later = NOW + pod_restarts.WINDOW_S + 10
    restart, why = pod_restarts.restart_or_hold(str(tmp_path), later, later)
    assert restart and "restart 1 of at most 3" in why


def test_a_ledger_behind_a_link_is_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("")
    (tmp_path / pod_restarts.LEDGER_NAME).symlink_to(elsewhere)
    with pytest.raises(OSError):
        pod_restarts.restart_or_hold(str(tmp_path), NOW, NOW)


def restart_vllm(pod: Pod, started: float) -> None:
    """vLLM's container restarted: its PID 1 is a new process; the canary's fresh verdict is corrupt again."""
    fake_proc(pod.root / "proc", started)
    pod.write("corrupt", diagnosis="repeat: NaN logprobs")


def test_a_corruption_loop_stops_at_the_cap_and_the_pod_stays_out_of_the_service(
    pod: Pod, vllm: Any, tmp_path: Path
) -> None:
    import time

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    extra = ("--ledger-dir", str(ledger))
    lives = []
    for number in range(4):
        restart_vllm(pod, time.time() - 100 + number)  # each a distinct process start
        lives.append([pod.probe("live", url_of(vllm), *extra) for _ in range(2)])
    said = [[outcome(result) for result in pair] for pair in lives]
    assert said == [["FAIL", "FAIL"]] * 3 + [["pass", "pass"]], said
    assert "corruption restart 1 of at most 3 within 3600 s" in lives[0][0].stdout
    assert "corrupt again after 3 corruption restarts within 3600 s (the cap is 3)" in lives[3][0].stdout
    ready = pod.probe("ready", url_of(vllm), *extra)
    assert outcome(ready) == "FAIL" and "the cap is 3" in ready.stdout
    # Held out even when the canary later says healthy: an operator decides (delete the pod).
    pod.write("healthy")
    ready = pod.probe("ready", url_of(vllm), *extra)
    assert outcome(ready) == "FAIL" and "delete the pod" in ready.stdout
    assert outcome(pod.probe("live", url_of(vllm), *extra)) == "pass"


def test_a_ledger_that_cannot_be_used_holds_the_restart(pod: Pod, vllm: Any, tmp_path: Path) -> None:
    """Fail closed: without a ledger the cap cannot hold, so no uncounted restart; readiness still fails."""
    not_a_dir = tmp_path / "ledger"
    not_a_dir.write_text("")
    pod.write("corrupt")
    live = pod.probe("live", url_of(vllm), "--ledger-dir", str(not_a_dir))
    assert outcome(live) == "pass" and "cannot be used" in live.stdout
    assert outcome(pod.probe("ready", url_of(vllm), "--ledger-dir", str(not_a_dir))) == "FAIL"
