"""Every address `deploykit serve` will listen on is checked before any model loads (issue 22, item 1).

Before, `serve --canary-listen <busy port>` loaded the model, passed the smoke, stored a PASS and only then
ended in a traceback when the canary could not bind. Here the port stage refuses it: an `error` row at
stage `port`, no vLLM started. A tripwire on the model stage proves nothing got that far.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.canary.settings import CanarySettings
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.serve import attempt as attempt_module
from deploykit.serve.attempt import run_serve
from deploykit.serve.console import ConsoleUI
from deploykit.serve.options import ServeOptions
from tests.cli_process import run_deploykit
from tests.vllm_harness import REPO


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something listens on for the whole test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reaching the model stage means the refusal came too late: that attempt's row says so."""

    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model stage was reached: an address was checked too late")

    monkeypatch.setattr(attempt_module, "ensure_model", tripwire)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def canary_on(listen: str) -> dict[str, object]:
    """ServeOptions' canary answering on `listen` (`--canary-listen`)."""
    return {"canary": CanarySettings(listen=listen), "canary_http": True}


def serve(tmp_path: Path, **options: object) -> tuple[int, ResultRecord]:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    code = run_serve(
        ServeOptions(profile="demo-cpu", store_url=store_url, log_dir=tmp_path / "logs", **options),  # type: ignore[arg-type]
        ConsoleUI(quiet=True),
    )
    store = open_store(store_url)
    try:
        (record,) = store.recent(limit=10)
    finally:
        store.close()
    return code, record


def test_a_busy_canary_port_is_refused_before_the_model_loads(
    tmp_path: Path, busy_port: int, no_model_loads: None
) -> None:
    code, record = serve(tmp_path, port=free_port(), **canary_on(f"127.0.0.1:{busy_port}"))
    assert code == exit_codes.FAILED
    assert (record.verdict, record.stage) == ("error", "port"), record.diagnosis
    assert f"port {busy_port} on 127.0.0.1 is already in use (the canary's /healthz)" in record.diagnosis
    assert "--canary-listen" in record.diagnosis
    assert not (tmp_path / "logs").exists()  # no vLLM log: nothing was started


def test_the_canary_and_vllm_on_one_port_are_refused(tmp_path: Path, no_model_loads: None) -> None:
    port = free_port()
    code, record = serve(tmp_path, port=port, **canary_on(f"0.0.0.0:{port}"))
    assert code == exit_codes.FAILED
    assert (record.verdict, record.stage) == ("error", "port"), record.diagnosis
    assert f"both ask for port {port}" in record.diagnosis


def test_a_canary_that_does_not_run_is_not_checked(tmp_path: Path, busy_port: int) -> None:
    """`--check` (and `--canary-every 0`) never start the canary's listener: its address is not the run's."""
    from deploykit.serve.attempt import listen_addresses

    listen = f"127.0.0.1:{busy_port}"
    for options in (
        ServeOptions(profile="p", check=True, **canary_on(listen)),
        ServeOptions(profile="p", **{**canary_on(listen), "canary": None}),
    ):
        assert [a.what for a in listen_addresses(options, "127.0.0.1", 8000)] == ["vLLM"]
    serving = ServeOptions(profile="p", **canary_on(listen))
    assert [a.what for a in listen_addresses(serving, "127.0.0.1", 8000)] == ["vLLM", "the canary's /healthz"]


def test_the_command_refuses_a_busy_canary_port_in_one_line(tmp_path: Path, busy_port: int) -> None:
    env = {**os.environ, "DEPLOYKIT_STORE": f"sqlite:///{tmp_path / 'results.sqlite'}"}
    run = run_deploykit(
        [
            "serve",
            "-p",
            "demo-cpu",
            "--port",
            str(free_port()),
            "--canary-listen",
            f"127.0.0.1:{busy_port}",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        env=env,
        cwd=REPO,
    )
    output = run.stdout + run.stderr
    assert run.returncode == exit_codes.FAILED, output
    assert "Traceback" not in output and "PASS" not in output, output
    assert "verdict: ERROR (port)" in output and "--canary-listen" in output, output
    assert not (tmp_path / "logs").exists(), output


def test_a_malformed_canary_address_is_a_usage_error(tmp_path: Path) -> None:
    env = {**os.environ, "DEPLOYKIT_STORE": f"sqlite:///{tmp_path / 'results.sqlite'}"}
    run = run_deploykit(["serve", "-p", "demo-cpu", "--canary-listen", "nowhere"], env=env, cwd=REPO)
    assert run.returncode == exit_codes.USAGE, run.stdout + run.stderr
    assert "--canary-listen 'nowhere': expected HOST:PORT" in run.stderr
    assert "Traceback" not in run.stdout + run.stderr
