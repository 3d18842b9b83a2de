"""A real HTTP server on a loopback port for tests that need something to answer (a fake vLLM, a proxy's
error page, a /metrics endpoint): the one helper every test that serves HTTP uses."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ServedURL(str):
    """The base URL (a str, as every caller uses it), with the server behind it (`.server`): its
    attributes are the state a test shares with its handler (`self.server.X` in the handler)."""

    server: Any


@contextlib.contextmanager
def serving(
    handler: Any, *, host: str = "127.0.0.1", poll_interval: float = 0.05, **state: Any
) -> Iterator[ServedURL]:
    """Serve `handler` (a request handler class, or a partial of one) on a free port of `host` (IPv4 or
    IPv6 loopback) for the `with` block; yields its base URL. Each keyword in `state` is set on the server
    before it answers. The block ends within poll_interval: shutdown() waits for the serving loop to look
    (socketserver's 0.5 s default kept each of ~100 tests half a second longer, idle)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
    server = server_class((host, 0), handler)
    for name, value in state.items():
        setattr(server, name, value)
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": poll_interval}, daemon=True
    ).start()
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    url = ServedURL(f"http://{shown}:{server.server_address[1]}")
    url.server = server
    try:
        yield url
    finally:
        server.shutdown()
        server.server_close()


class Answers500(BaseHTTPRequestHandler):
    """A server that is up and fails every request: a store's or a server's outage as a smoke sees it."""

    def do_POST(self) -> None:
        self.send_response(500)
        self.end_headers()

    do_GET = do_POST

    def log_message(self, *_: object) -> None:
        pass
