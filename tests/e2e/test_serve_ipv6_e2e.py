"""`deploykit serve` on IPv6 loopback: a profile with `serve: {host: "::1"}` serves the tiny model and passes
`--check` (bracketed URL `http://[::1]:PORT`), and a port held on ::1 is refused before vLLM starts."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from deploykit.net import free_port
from tests.e2e.test_serve_e2e import START_TIMEOUT_S, assert_nothing_left, command_env, demo_variant, only_row
from tests.serve_helpers import CommandRun
from tests.test_net import needs_ipv6

pytestmark = [pytest.mark.e2e, needs_ipv6]


def test_a_profile_on_ipv6_loopback_serves_and_passes_check(tmp_path: Path) -> None:
    profile = demo_variant(tmp_path, "ipv6-check", serve__host="::1")
    port = free_port("::1")
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    run = CommandRun(
        ["serve", "--profile", str(profile), "--check", "--port", str(port), "--store", store_url],
        command_env(tmp_path),
    )
    try:
        assert run.finish(START_TIMEOUT_S) == 0, run.tail()
    finally:
        run.kill_everything()
    url = f"http://[::1]:{port}"
    assert "vLLM healthy after" in run.output and f"at {url}" in run.output
    assert "verdict: PASS (done)" in run.output
    record = only_row(store_url)
    assert record.verdict == "pass" and record.base_url == url
    assert record.plan is not None and record.plan["argv"][record.plan["argv"].index("--host") + 1] == "::1"
    assert_nothing_left(run)


def test_a_port_held_on_ipv6_loopback_is_refused_before_vllm_starts(tmp_path: Path) -> None:
    profile = demo_variant(tmp_path, "ipv6-busy", serve__host="::1")
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as holder:
        holder.bind(("::1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        run = CommandRun(
            ["serve", "--profile", str(profile), "--check", "--port", str(port), "--store", store_url],
            command_env(tmp_path),
        )
        assert run.finish(120) == 1
    assert f"port {port} on ::1 is already in use" in run.output
    assert run.vllm_pid() is None
    record = only_row(store_url)
    assert record.verdict == "error" and record.stage == "port"
    assert_nothing_left(run)
