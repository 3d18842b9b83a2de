"""The unit's ExecStartPost= health wait, against a real HTTP server that is unhealthy, then healthy."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from deploykit.render.wait_health import wait_healthy
from tests.http_server import serving


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        server = self.server
        server.calls += 1  # type: ignore[attr-defined]
        status = 503 if server.calls <= server.unhealthy_answers else 200  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Any]:
    """tests/http_server.py serving: `calls` counts the requests, the first `unhealthy_answers` get 503."""
    with serving(_Health, calls=0, unhealthy_answers=0) as url:
        yield url.server


def test_waits_through_unhealthy_answers(server: Any) -> None:
    server.unhealthy_answers = 3
    waited = wait_healthy(f"http://127.0.0.1:{server.server_port}/health", timeout_s=10, poll_interval_s=0.05)
    assert waited is not None and server.calls == 4


def test_gives_up_at_the_deadline_and_the_command_fails(server: Any) -> None:
    server.unhealthy_answers = 10**6
    url = f"http://127.0.0.1:{server.server_port}/health"
    assert wait_healthy(url, timeout_s=0.5, poll_interval_s=0.1) is None
    command = [sys.executable, "-m", "deploykit.render.wait_health", url]
    command += ["--timeout-s", "0.5", "--poll-interval-s", "0.1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and "did not answer 200" in result.stderr


def test_a_closed_port_is_unhealthy_not_an_error() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert wait_healthy(f"http://127.0.0.1:{port}/health", timeout_s=0.3, poll_interval_s=0.1) is None
