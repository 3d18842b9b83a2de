"""The canary's HTTP listener (standard library): `/healthz` for readiness (503 once the output is wrong, the
engine hung, or the server unreachable with no progress seen; 200 while merely saturated), `/livez` for
liveness (503 only on corruption, a hung engine or a dead server), `/metrics`."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from deploykit.canary.settings import ListenAddressError

if TYPE_CHECKING:
    from deploykit.canary.runner import Canary


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


def listen(canary: Canary, flag: str = "--listen") -> ThreadingHTTPServer:
    """`serve_http` on the canary's `listen` address, a ListenAddressError (one line, the option named)
    when it cannot be bound."""
    address = canary.config.settings.listen
    host, port = canary.config.settings.listen_address
    try:
        return serve_http(canary, host, port)
    except OSError as exc:
        raise ListenAddressError(
            f"{flag} {address}: cannot listen on {host}:{port} ({exc.strerror or exc}); choose another "
            "HOST:PORT"
        ) from None
