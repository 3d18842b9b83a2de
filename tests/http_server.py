"""A real HTTP server on a loopback port for tests that need something to answer (a fake vLLM, a proxy's
error page, a /metrics endpoint)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any


@contextlib.contextmanager
def serving(handler: Any) -> Iterator[str]:
    """Serve `handler` (a request handler class, or a partial of one) on a free loopback port for the
    `with` block; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
