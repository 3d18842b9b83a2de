"""The canary's HTTP listener (standard library): `/healthz` for readiness (503 once the output is wrong or
the server unreachable), `/livez` for liveness (503 only on corruption or a dead server), `/metrics`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from deploykit.canary.defaults import LISTEN
from deploykit.errors import CanaryError

if TYPE_CHECKING:
    from deploykit.canary.runner import Canary


class ListenAddressError(CanaryError, ValueError):
    """A listen address that is not HOST:PORT, or one that cannot be bound."""


def parse_listen(value: str, flag: str = "--listen") -> tuple[str, int]:
    """HOST:PORT (`[::1]:9400`, `:9400` for every address; port 0 picks a free one)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ListenAddressError(f"{flag} {value!r}: expected HOST:PORT, e.g. {LISTEN}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve_http(canary: Canary, host: str, port: int) -> ThreadingHTTPServer:
    """`/healthz`, `/livez` and `/metrics` on a daemon thread; `.shutdown()` stops it. Port 0 picks a free
    port. Raises OSError when the address cannot be bound (see `listen`)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                healthy, text = canary.health()
                self._answer(200 if healthy else 503, text.encode() + b"\n", "text/plain; charset=utf-8")
            elif path == "/livez":
                alive, text = canary.liveness()
                self._answer(200 if alive else 503, text.encode() + b"\n", "text/plain; charset=utf-8")
            elif path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                self._answer(200, canary.metrics.text(), CONTENT_TYPE_LATEST)
            else:
                self._answer(
                    404, b"not found: try /healthz, /livez or /metrics\n", "text/plain; charset=utf-8"
                )

        def _answer(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: keep quiet
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="deploykit-canary-http", daemon=True).start()
    return server


def listen(canary: Canary, address: str, flag: str = "--listen") -> ThreadingHTTPServer:
    """`serve_http` on HOST:PORT, a ListenAddressError (one line, the flag named) when it cannot be."""
    host, port = parse_listen(address, flag)
    try:
        return serve_http(canary, host, port)
    except OSError as exc:
        raise ListenAddressError(
            f"{flag} {address}: cannot listen on {host}:{port} ({exc.strerror or exc}); choose another "
            "HOST:PORT"
        ) from None
