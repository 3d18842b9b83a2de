"""One bounded HTTP request: every read deploykit makes from a server goes through `fetch`.

httpx's and urllib's timeouts bound each socket operation, not the request: a server that trickles one byte
a second, or sends headers and then nothing, keeps such a read alive for as long as it likes, and a server
that answers 2 GB grows the reader to 2 GB. `fetch` bounds both, whatever the server does:

- a **deadline for the whole request**, connect to last byte: a watchdog timer shuts the socket down when
  it passes, which ends a read blocked on a silent server as surely as one fed a byte at a time (the
  headers included);
- a **size cap** on the body: it is read in chunks and the read stops at the cap (a Content-Length over the
  cap is refused before the body is read), so memory stays at the cap plus one chunk;
- **interim answers are not the answer**: a `103 Early Hints` or `100 Continue` before the real status is
  skipped (http.client itself skips only 100 and would hand back the 103, body empty, as the answer), and
  together they may take at most `INTERIM_CAP_BYTES`, so a server that sends them without end meets the cap
  or the deadline like any other.

It never raises for anything the server or the network does: the `Reply` says what happened, in one line.
Standard library only (`http.client`, imported at the first request), cheap to import: the systemd
unit's `wait_health`, in the service's sandbox, uses it through `net.health_ok`. No `*_proxy` variable
is read: deploykit talks to the server it was pointed at. The caps are in docs/fail-closed.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import http.client

MIB = 1024 * 1024

ANSWER_CAP_BYTES = 16 * MIB
"""A completion or chat answer. The biggest the smoke and canary ask for (a few hundred tokens, each with
its top-k logprobs as JSON) is well under 1 MiB; 16 leaves room for a profile's longer cases."""

METRICS_CAP_BYTES = 8 * MIB
"""A `/metrics` page. vLLM's is a few hundred KiB (histograms per engine and per LoRA adapter)."""

LISTING_CAP_BYTES = 1 * MIB
"""`/v1/models` and deploykit's own status route: a few KiB each."""

HEALTH_CAP_BYTES = 64 * 1024
"""`/health`: vLLM's answers with an empty body."""

INTERIM_CAP_BYTES = 64 * 1024
"""Every interim (1xx) answer before the real one, status lines and headers together: a 103 Early Hints is
a few hundred bytes."""

CHUNK_BYTES = 64 * 1024

Failure = Literal["deadline", "too_big", "transport"]


@dataclass(frozen=True)
class Reply:
    """What one request got: the status and body, or why there is none (`failure`, `problem`)."""

    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    """Lower-cased names."""
    body: bytes = b""
    failure: Failure | None = None
    problem: str = ""
    """One line when `failure` is set: `no complete answer within 5 s`, `... over the 16 MiB cap`."""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        """A whole answer came back (of any HTTP status)."""
        return self.failure is None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def describe_cap(max_bytes: int) -> str:
    if max_bytes >= MIB and max_bytes % MIB == 0:
        return f"{max_bytes // MIB} MiB"
    if max_bytes >= 1024 and max_bytes % 1024 == 0:
        return f"{max_bytes // 1024} KiB"
    return f"{max_bytes} bytes"


class _Watchdog:
    """Shuts the connection's socket down at the deadline: a blocked read returns at once."""

    def __init__(self, connection: http.client.HTTPConnection, deadline_s: float) -> None:
        self.fired = False
        self._connection = connection
        self._timer = threading.Timer(max(0.0, deadline_s), self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        sock = self._connection.sock
        if sock is not None:
            # The plain socket's shutdown, also under TLS: the fd is what a blocked read waits on.
            with contextlib.suppress(OSError):  # already closed
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def __enter__(self) -> _Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


class _InterimOverCap(Exception):
    """The server's interim (1xx) answers went past INTERIM_CAP_BYTES before any real answer."""


@functools.cache
def _final_response_class() -> type[http.client.HTTPResponse]:
    """http.client's response, reading past every interim answer to the final one (built at the first
    request: http.client is not imported before)."""
    import http.client

    class FinalResponse(http.client.HTTPResponse):
        def begin(self) -> None:
            interim_bytes = 0
            while True:
                super().begin()
                # 101 Switching Protocols ends HTTP on this connection: it is the (wrong) answer.
                if not 100 <= self.status < 200 or self.status == 101:
                    return
                interim_bytes += 16 + len(self.reason) + sum(len(k) + len(v) + 4 for k, v in self.msg.items())
                if interim_bytes > INTERIM_CAP_BYTES:
                    raise _InterimOverCap
                self.headers = self.msg = None  # type: ignore[assignment]  # begin() reads the next answer

    return FinalResponse


def _connection(url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    """The connection for `url` and the request target (path and query). Raises ValueError."""
    import http.client  # here: importing the smoke's records (the store does) needs no HTTP client
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    port = parts.port  # ValueError for a port that is not one
    if not parts.hostname:
        raise ValueError("no host in the URL")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection: http.client.HTTPConnection
    if parts.scheme == "https":
        connection = http.client.HTTPSConnection(parts.hostname, port, timeout=timeout_s)
    elif parts.scheme == "http":
        connection = http.client.HTTPConnection(parts.hostname, port, timeout=timeout_s)
    else:
        raise ValueError(f"{parts.scheme or 'no'} scheme: expected http or https")
    connection.response_class = _final_response_class()
    return connection, target


def fetch(
    url: str,
    *,
    deadline_s: float,
    max_bytes: int,
    method: str = "GET",
    json_body: Any = None,
    headers: Mapping[str, str] | None = None,
    on_chunk: Callable[[bytes], None] | None = None,
) -> Reply:
    """One request to `url`, ended at `deadline_s` seconds (connect to last byte) or `max_bytes` of body,
    whichever comes first; never raises for the server's or the network's doing. `on_chunk` sees each
    piece of the body as it arrives (a stream's timing: `deploykit.gate.load_sample`), within the caps."""
    import http.client

    started = time.monotonic()
    deadline = started + deadline_s
    cap = describe_cap(max_bytes)

    def reply(**kwargs: Any) -> Reply:
        return Reply(elapsed_s=time.monotonic() - started, **kwargs)

    def late() -> Reply:
        return reply(failure="deadline", problem=f"no complete answer within {deadline_s:g} s")

    try:
        connection, target = _connection(url, deadline_s)
    except ValueError as exc:
        return reply(failure="transport", problem=f"bad URL: {exc}")
    request_headers = dict(headers or {})
    payload: bytes | None = None
    if json_body is not None:
        payload = json.dumps(json_body).encode()
        request_headers.setdefault("Content-Type", "application/json")
    watchdog = _Watchdog(connection, deadline_s)
    try:
        with watchdog:
            connection.connect()
            if watchdog.fired:
                return late()
            connection.request(method, target, body=payload, headers=request_headers)
            response = connection.getresponse()
            answer_headers = {name.lower(): value for name, value in response.getheaders()}
            declared = answer_headers.get("content-length", "")
            if declared.isdigit() and int(declared) > max_bytes:
                return reply(
                    status=response.status,
                    headers=answer_headers,
                    failure="too_big",
                    problem=f"the answer is {int(declared):,} bytes, over the {cap} cap",
                )
            body = bytearray()
            while True:
                chunk = response.read1(CHUNK_BYTES)
                if not chunk:
                    break
                body += chunk
                if on_chunk is not None and len(body) <= max_bytes:
                    on_chunk(chunk)
                if len(body) > max_bytes:
                    return reply(
                        status=response.status,
                        headers=answer_headers,
                        failure="too_big",
                        problem=f"the answer is over the {cap} cap (reading stopped there)",
                    )
                if time.monotonic() > deadline:
                    return late()
            if watchdog.fired:
                return late()  # the shutdown read as an end of body: the answer may be cut short
            return reply(status=response.status, headers=answer_headers, body=bytes(body))
    except _InterimOverCap:
        return reply(
            failure="too_big",
            problem=f"over {describe_cap(INTERIM_CAP_BYTES)} of interim (1xx) answers and no answer",
        )
    except (OSError, http.client.HTTPException, ValueError) as exc:
        if watchdog.fired or time.monotonic() >= deadline:
            return late()
        return reply(failure="transport", problem=f"{type(exc).__name__}: {exc}".rstrip(": "))
    finally:
        connection.close()
