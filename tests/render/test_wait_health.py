"""The unit's ExecStartPost= health wait, against a real HTTP server that is unhealthy, then healthy."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from deploykit.render.wait_health import wait_healthy


class _Health(BaseHTTPRequestHandler):
    unhealthy_answers = 0

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.calls += 1
        status = 503 if server.calls <= server.unhealthy_answers else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Server(ThreadingHTTPServer):
    calls = 0
    unhealthy_answers = 0


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def test_waits_through_unhealthy_answers(server: _Server) -> None:
    server.unhealthy_answers = 3
    waited = wait_healthy(f"http://127.0.0.1:{server.server_port}/health", timeout_s=10, poll_interval_s=0.05)
    assert waited is not None and server.calls == 4


def test_gives_up_at_the_deadline_and_the_command_fails(server: _Server) -> None:
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
