"""The pure parts of `deploykit serve`: launch argv and env, secrets, redaction, timings, exit codes."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from deploykit.plan import Plan, make_plan
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import parse_profile
from deploykit.profile.schema import LoadedProfile
from deploykit.results.record import ResultRecord
from deploykit.serve.console import LogFollower
from deploykit.serve.helpers import (
    REDACTED,
    exit_code_for,
    overhead,
    redact,
    resolve_executable,
    secret_values,
)
from deploykit.serve.signals import SignalGate
from deploykit.serve.stages import StageFailure, launch_environment

PROFILE = """
name: secretive
platform: cpu
model: {source: /models/m, served_name: m}
serve: {api_key_env: MY_API_KEY, port: 8123}
env:
  HF_HUB_OFFLINE: "1"
  HF_TOKEN: {secret: MY_HF_TOKEN}
"""


def plan() -> Plan:
    loaded = LoadedProfile(profile=parse_profile(PROFILE), path=Path("secretive.yaml"))
    return make_plan(loaded, ProbeFacts(error="no GPU"))


def test_vllm_resolves_to_the_one_beside_this_python() -> None:
    resolved = resolve_executable(["vllm", "serve", "m"])
    beside = Path(sys.executable).parent / "vllm"
    assert resolved[0] == (str(beside) if beside.exists() else "vllm")
    assert resolve_executable(["/opt/vllm", "serve"])[0] == "/opt/vllm"


def test_secrets_are_resolved_only_into_the_launch_environment() -> None:
    the_plan = plan()
    assert the_plan.env["HF_TOKEN"] == "${MY_HF_TOKEN}"
    parent = {
        "PATH": "/bin",
        "MY_HF_TOKEN": "hf_secretvalue",
        "MY_API_KEY": "key-123456",
        "DEPLOYKIT_FIXES": "x",
    }
    env = launch_environment(the_plan, parent)
    assert env["HF_TOKEN"] == "hf_secretvalue"
    assert env["VLLM_API_KEY"] == "key-123456"
    assert env["HF_HUB_OFFLINE"] == "1" and env["PATH"] == "/bin"
    assert "DEPLOYKIT_FIXES" not in env  # only the plan decides the fixes
    assert not any("secretvalue" in arg or "key-123456" in arg for arg in the_plan.argv)


def test_every_missing_secret_is_named() -> None:
    with pytest.raises(StageFailure) as caught:
        launch_environment(plan(), {"PATH": "/bin"})
    assert caught.value.stage == "secrets"
    assert "HF_TOKEN (from $MY_HF_TOKEN)" in str(caught.value)
    assert "VLLM_API_KEY (from $MY_API_KEY)" in str(caught.value)


def test_redaction_covers_referenced_and_secret_named_variables() -> None:
    parent = {
        "MY_HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz",
        "MY_API_KEY": "key-123456",
        "DB_PASSWORD": "hunter22",
        "HOME": "/root",
        "SHORT_TOKEN": "abc",
    }
    values = secret_values(plan(), parent)
    assert set(values) == {"hf_abcdefghijklmnopqrstuvwxyz", "key-123456", "hunter22"}
    text = "token hf_abcdefghijklmnopqrstuvwxyz key key-123456 pw hunter22 home /root"
    assert redact(text, values) == f"token {REDACTED} key {REDACTED} pw {REDACTED} home /root"
    # An HF token nobody declared is still recognised by its shape.
    assert redact("got hf_ZZZZZZZZZZZZZZZZZZZZZZZZ here", []) == f"got {REDACTED} here"


def test_overhead_excludes_vllm_and_the_requests() -> None:
    timings: dict[str, float | None] = {
        "total_s": 40.0,
        "startup_s": 30.0,
        "requests_s": 6.0,
        "stop_s": 3.5,
        "model_build_s": None,
    }
    assert overhead(timings) == pytest.approx(0.5)
    assert overhead({"total_s": 1.0, "startup_s": 2.0}) == 0.0


def test_exit_codes() -> None:
    assert exit_code_for(ResultRecord(verdict="pass", stage="done")) == 0
    assert exit_code_for(ResultRecord(verdict="fail", stage="done")) == 1
    assert exit_code_for(ResultRecord(verdict="error", stage="port")) == 1
    interrupted = ResultRecord(
        verdict="interrupted", stage="startup", timings={"signal": float(signal.SIGINT)}
    )
    assert exit_code_for(interrupted) == 130


def test_signal_gate_raises_once_then_only_remembers() -> None:
    from deploykit.serve.signals import Interrupted

    gate = SignalGate()
    with pytest.raises(Interrupted):
        gate.handler(signal.SIGTERM, None)
    gate.handler(signal.SIGINT, None)  # during cleanup: remembered, not raised
    assert gate.received == signal.SIGTERM and not gate.armed


def test_log_follower_returns_only_complete_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "v.log"
    follower = LogFollower(log)
    assert follower.new_lines() == []
    log.write_bytes(b"one\ntw")
    assert follower.new_lines() == ["one"]
    with log.open("ab") as handle:
        handle.write(b"o\nthree\n")
    assert follower.new_lines() == ["two", "three"]
    assert follower.new_lines() == []
