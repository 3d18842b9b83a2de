"""A TCP proxy on a loopback port, for tests of a store that goes away: `stop()` closes its listener and
cuts every connection through it at once (as a killed proxy or a lost network does); `start()` listens
again on the same port."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class TcpProxy:
    """Forwards 127.0.0.1:`port` to `target`; `on_connect` runs (in the proxy's thread) for each new
    client before anything is forwarded."""

    def __init__(
        self, target: tuple[str, int], port: int | None = None, on_connect: Callable[[], None] | None = None
    ) -> None:
        self.target = target
        self.port = port or free_loopback_port()
        self.on_connect = on_connect
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def _call(self, coroutine: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout=30)

    def start(self) -> TcpProxy:
        self._call(self._start())
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (callable from any thread, the proxy's too)."""
        if threading.current_thread() is self._thread:
            self._stop_now()
        else:
            self._call(self._stop())

    def close(self) -> None:
        if self._server is not None:
            self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _stop(self) -> None:
        self._stop_now()

    def _stop_now(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.on_connect is not None:
            self.on_connect()
        if self._server is None:  # stopped by on_connect
            writer.transport.abort()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, upstream_writer))
        await asyncio.gather(self._pipe(reader, upstream_writer), self._pipe(upstream_reader, writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.transport.abort()
