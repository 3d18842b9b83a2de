"""`deploykit serve` and `deploykit smoke` as real commands against the real vLLM CPU build.

vLLM starts in this file (each costs 30–60 s on a 2-core box, more when it is busy):
  1. the demo profile, serving in the foreground: PASS, its row, `deploykit smoke` against it, SIGTERM;
  2. a tiny model whose logits are all NaN, with a planted HF token and API key (--check);
  3. a tiny model whose logits are all 0.0, so greedy emits id 0 forever (--check);
  4. a model path that does not exist: vLLM exits during start-up (cheap: it dies while loading);
  5. a 3 s start-up timeout (cheap: killed 3 s in);
  6. SIGTERM while vLLM loads (cheap: stopped once its engine process exists).
A port already in use and a missing secret fail before vLLM starts.
Every case checks: a clear message, nothing left running, exactly one stored row.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deploykit.net import free_port, port_in_use
from tests.profile_variants import profile_variant
from tests.serve_helpers import (
    CommandRun,
    dump_store,
    fresh_pg_url,
    group_members,
    only_row,
    read_proc,
)

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = float(os.environ.get("DEPLOYKIT_TEST_STARTUP_TIMEOUT", "600"))


def command_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("DEPLOYKIT_STORE", "DEPLOYKIT_FIXES", "VLLM_API_KEY"):
        env.pop(name, None)
    env.update(
        {
            # The default store and log directories land in the test's own directory.
            "XDG_DATA_HOME": str(tmp / "data"),
            "XDG_STATE_HOME": str(tmp / "state"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
            "COLUMNS": "200",
        }
    )
    env.update(extra)
    return env


def demo_variant(tmp: Path, name: str, **changes: Any) -> Path:
    """The demo profile renamed, with fields replaced (`model__source=...` sets model.source)."""
    dotted = {key.replace("__", "."): value for key, value in changes.items()}
    return profile_variant(tmp, "demo-cpu", {"name": name, **dotted})


def assert_nothing_left(run: CommandRun) -> None:
    pid = run.vllm_pid()
    if pid is not None:
        deadline = time.monotonic() + 20
        while group_members(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group_members(pid) == [], f"vLLM's process group {pid} still has members"
    assert group_members(run.process.pid) == [], "deploykit's session left processes behind"


# --- 1. the demo, serving in the foreground ---------------------------------------------------------


@dataclass
class DemoServer:
    run: CommandRun
    port: int
    store_url: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoServer]:
    tmp = tmp_path_factory.mktemp("demo")
    port = free_port()
    run = CommandRun(["serve", "--profile", "demo-cpu", "--port", str(port)], command_env(tmp))
    store_url = f"sqlite:///{tmp / 'data' / 'deploykit' / 'results.sqlite'}"
    try:
        run.wait_for(r"^serving tiny at ", START_TIMEOUT_S)
        yield DemoServer(run, port, store_url)
    finally:
        run.stop(60)


def test_demo_passes_and_its_row_is_in_the_default_store(demo: DemoServer) -> None:
    output = demo.run.output
    names = [
        "completion",
        "chat",
        "repeat:1",
        "repeat:2",
        "long_then_short:short",
        "long_then_short:long",
        "long_then_short:again",
        "fingerprint",  # docs/fingerprints.md
    ]
    assert f"verdict: PASS (done): all 8 cases passed ({', '.join(names)})" in output
    assert f"stored in {demo.store_url}" in output  # XDG_DATA_HOME/deploykit/results.sqlite
    record = only_row(demo.store_url)
    assert record.verdict == "pass" and record.profile_name == "demo-cpu"
    assert record.profile_id and len(record.profile_id) == 64
    assert [c.name for c in record.cases] == names
    for case in record.cases:
        assert case.passed and case.http_status == 200
        assert case.first_ids and any(i not in (0, 1, 2, 3) for i in case.first_ids)
        assert case.finish_reason in ("length", "stop") and case.latency_s > 0
        if case.finish_reason == "length" and case.name != "fingerprint":  # its probes ask for 8 tokens
            assert len(case.first_ids) == 16
    assert record.plan is not None
    argv = record.plan["argv"]
    assert argv[argv.index("--port") + 1] == str(demo.port)
    assert record.versions["vllm"] and "cpu" in record.versions["vllm"]
    assert (record.timings["startup_s"] or 0) > 1
    assert record.log_tail and record.log_path and Path(record.log_path).exists()
    assert record.facts is not None and "gpus" in record.facts


def test_smoke_command_against_the_running_server_stores_in_postgres(
    demo: DemoServer, tmp_path: Path
) -> None:
    url = f"http://127.0.0.1:{demo.port}"
    with fresh_pg_url() as pg:
        smoke = CommandRun(
            ["smoke", "--url", url, "--profile", "demo-cpu", "--store", pg], command_env(tmp_path)
        )
        assert smoke.finish(180) == 0, smoke.output
        record = only_row(pg)
        assert record.command == "smoke" and record.verdict == "pass"
        assert len(record.cases) == 8 and all(c.passed for c in record.cases)  # 7 + the fingerprint
    wrong = CommandRun(["smoke", "--url", url, "--model", "nope", "--no-store"], command_env(tmp_path))
    assert wrong.finish(180) == 1
    assert "HTTP 404" in wrong.output


def test_sigterm_stops_the_server_and_leaves_nothing(demo: DemoServer) -> None:
    vllm_pid = demo.run.vllm_pid()
    assert vllm_pid is not None and group_members(vllm_pid), "vLLM should be serving"
    demo.run.process.send_signal(signal.SIGTERM)
    assert demo.run.finish(90) == 0
    assert "SIGTERM received: stopping vLLM" in demo.run.output
    assert "vLLM stopped; nothing left running" in demo.run.output
    assert_nothing_left(demo.run)
    assert not port_in_use(demo.port)
    assert only_row(demo.store_url).verdict == "pass"  # still exactly one row


# --- 2. NaN logits, with planted secrets ------------------------------------------------------------


def settled_environ(pid: int, timeout: float = 30) -> list[bytes]:
    """A process's environment, read until there is one: the pid is setpriv's, which execs vLLM, and
    /proc shows an empty environment while a process is inside execve (seen once on CI)."""
    deadline = time.monotonic() + timeout
    while True:
        environ = [entry for entry in read_proc(pid, "environ").split(b"\0") if entry]
        if environ or time.monotonic() > deadline:
            return environ
        time.sleep(0.05)


def test_nan_model_is_flagged_and_no_secret_leaks(tmp_path: Path) -> None:
    from deploykit.tinymodel import TinyModelRecipe, build_tiny_model

    model = build_tiny_model(TinyModelRecipe(behaviour="nan"))
    hf_token = "hf_" + secrets.token_hex(16)
    api_key = "sk-e2e-" + secrets.token_hex(12)
    profile = demo_variant(
        tmp_path,
        "nan-check",
        model__source=str(model),
        serve__api_key_env="DK_E2E_API_KEY",
        env={"HF_HUB_OFFLINE": "1", "HF_TOKEN": {"secret": "DK_E2E_HF_TOKEN"}},
    )
    env = command_env(tmp_path, DK_E2E_HF_TOKEN=hf_token, DK_E2E_API_KEY=api_key)
    with fresh_pg_url() as store_url:
        run = CommandRun(
            ["serve", "--profile", str(profile), "--check", "--port", str(free_port()), "--store", store_url],
            env,
        )
        try:
            pid = int(run.wait_for(r"vLLM started: pid (\d+)", 120).group(1))
            # While vLLM loads: the secrets are in its environment, never in any process's argv.
            environ = settled_environ(pid)
            assert f"HF_TOKEN={hf_token}".encode() in environ
            assert f"VLLM_API_KEY={api_key}".encode() in environ
            seen = 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and seen < 3:  # API server, engine core, worker
                members = group_members(pid)
                for member in members:
                    cmdline = read_proc(member, "cmdline")
                    assert hf_token.encode() not in cmdline and api_key.encode() not in cmdline
                seen = max(seen, len(members))
                time.sleep(1)
            assert run.finish(START_TIMEOUT_S) == 1, run.tail()
        finally:
            run.kill_everything()
        record = only_row(store_url)
        stored = dump_store(store_url)
    assert record.verdict == "fail" and record.stage == "done"
    assert "float values are out of range" in record.diagnosis and "NaN" in record.diagnosis
    assert all(case.http_status == 400 for case in record.cases)  # the API key was accepted: no 401
    assert "verdict: FAIL" in run.output and "NaN or infinite" in run.output
    assert record.plan is not None
    assert record.plan["env"]["HF_TOKEN"] == "${DK_E2E_HF_TOKEN}"
    assert record.plan["env"]["VLLM_API_KEY"] == "${DK_E2E_API_KEY}"
    log = Path(record.log_path or "").read_text()
    for secret in (hf_token, api_key):
        assert secret not in stored, "a secret reached the store"
        assert secret not in run.output, "a secret reached the terminal"
        assert secret not in log, "a secret reached vLLM's log"
        assert secret not in " ".join(record.plan["argv"])
    assert_nothing_left(run)


# --- 3. every logit 0.0: greedy emits id 0 ----------------------------------------------------------


def test_token0_model_is_flagged(tmp_path: Path) -> None:
    from deploykit.tinymodel import TinyModelRecipe, build_tiny_model

    model = build_tiny_model(TinyModelRecipe(behaviour="token0"))
    profile = demo_variant(tmp_path, "token0-check", model__source=str(model))
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    run = CommandRun(
        [
            "serve",
            "--profile",
            str(profile),
            "--check",
            "--quiet",
            "--port",
            str(free_port()),
            "--store",
            store_url,
        ],
        command_env(tmp_path),
    )
    try:
        assert run.finish(START_TIMEOUT_S) == 1, run.tail()
    finally:
        run.kill_everything()
    record = only_row(store_url)
    assert record.verdict == "fail"
    assert "every generated id is 0 or a special/pad token" in record.diagnosis
    assert "while finish_reason is `length`" in record.diagnosis
    # A silent failure: HTTP 200 every time, and not one word.
    assert all(case.http_status == 200 and case.first_ids == [0] * 16 for case in record.cases)
    assert "verdict: FAIL" in run.output
    # --quiet: vLLM's log stays in its file (progress lines may quote its latest line)
    assert not [line for line in run.lines if line.startswith(("(APIServer", "(EngineCore"))]
    assert_nothing_left(run)


# --- 4–7. failures around start-up ------------------------------------------------------------------


def test_a_server_that_exits_during_startup(tmp_path: Path) -> None:
    profile = demo_variant(tmp_path, "no-model", model__source=str(tmp_path / "no-such-model"))
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    run = CommandRun(
        ["serve", "--profile", str(profile), "--check", "--port", str(free_port()), "--store", store_url],
        command_env(tmp_path),
    )
    try:
        assert run.finish(START_TIMEOUT_S) == 1
    finally:
        run.kill_everything()
    assert "vLLM exited during start-up with code" in run.output
    record = only_row(store_url)
    assert record.verdict == "error" and record.stage == "startup"
    assert "exited during start-up with code" in record.diagnosis
    assert "last log lines" in record.diagnosis and record.log_tail
    assert_nothing_left(run)


def test_startup_timeout(tmp_path: Path) -> None:
    profile = demo_variant(tmp_path, "too-slow", deploy__startup_timeout_s=3)
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    started = time.monotonic()
    run = CommandRun(
        ["serve", "--profile", str(profile), "--check", "--port", str(free_port()), "--store", store_url],
        command_env(tmp_path),
    )
    try:
        assert run.finish(120) == 1
    finally:
        run.kill_everything()
    assert time.monotonic() - started < 60
    assert "did not become healthy within 3 s (start-up timeout)" in run.output
    record = only_row(store_url)
    assert record.verdict == "error" and record.stage == "startup"
    assert run.vllm_pid() is not None
    assert_nothing_left(run)


def test_sigterm_while_vllm_loads(tmp_path: Path) -> None:
    """A stop request in the middle of start-up: vLLM's whole group goes, and the attempt is still a row."""
    port = free_port()
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    run = CommandRun(
        ["serve", "--profile", "demo-cpu", "--check", "--port", str(port), "--store", store_url],
        command_env(tmp_path),
    )
    try:
        pid = int(run.wait_for(r"vLLM started: pid (\d+)", 120).group(1))
        deadline = time.monotonic() + 60
        while len(group_members(pid)) < 2 and time.monotonic() < deadline:  # the engine core has forked
            time.sleep(0.2)
        assert len(group_members(pid)) >= 2, "vLLM never got as far as its engine process"
        run.process.send_signal(signal.SIGTERM)
        assert run.finish(90) == 128 + signal.SIGTERM, run.tail()
    finally:
        run.kill_everything()
    assert "vLLM healthy after" not in run.output  # it really was stopped during start-up
    assert "its process group is gone" in run.output and "stopped by SIGTERM during startup" in run.output
    record = only_row(store_url)
    assert record.verdict == "interrupted" and record.stage == "startup"
    assert record.diagnosis == "stopped by SIGTERM during startup"
    assert record.log_tail and record.plan is not None
    assert_nothing_left(run)
    assert not port_in_use(port)


def test_port_already_in_use(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = CommandRun(
            ["serve", "--profile", "demo-cpu", "--check", "--port", str(port), "--store", store_url],
            command_env(tmp_path),
        )
        assert run.finish(120) == 1
    assert f"port {port} on 127.0.0.1 is already in use" in run.output
    assert run.vllm_pid() is None  # vLLM was never started
    record = only_row(store_url)
    assert record.verdict == "error" and record.stage == "port"
    assert_nothing_left(run)


def test_missing_secret(tmp_path: Path) -> None:
    profile = demo_variant(tmp_path, "needs-token", env={"HF_TOKEN": {"secret": "DK_E2E_UNSET_TOKEN"}})
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    env = command_env(tmp_path)
    env.pop("DK_E2E_UNSET_TOKEN", None)
    run = CommandRun(
        ["serve", "--profile", str(profile), "--check", "--port", str(free_port()), "--store", store_url], env
    )
    assert run.finish(120) == 1
    assert "not set: HF_TOKEN (from $DK_E2E_UNSET_TOKEN)" in run.output
    assert run.vllm_pid() is None
    record = only_row(store_url)
    assert record.verdict == "error" and record.stage == "secrets"
    assert record.plan is not None and record.plan["env"]["HF_TOKEN"] == "${DK_E2E_UNSET_TOKEN}"
