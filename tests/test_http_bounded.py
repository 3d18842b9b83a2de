"""`http_bounded.fetch`, the one bounded read, against real loopback servers: the whole-request deadline
holds whether the server trickles its body or its headers, or sends nothing at all; the size cap stops a
body at the cap, declared or not; nothing the server does raises."""

from __future__ import annotations

import contextlib
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from deploykit.http_bounded import Reply, describe_cap, fetch
from deploykit.net import health_ok
from tests.http_server import serving

SLACK_S = 8.0  # a loaded CI machine; the bug this guards against ran for minutes


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stop = threading.Event()

    def do_GET(self) -> None:
        path = self.path
        if path == "/silent":
            self.stop.wait(60)
            return
        if path.startswith("/early-hints"):
            self._early_hints(path)
            return
        if path == "/trickle-headers":
            with contextlib.suppress(OSError):
                for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 100:
                    if self.stop.wait(0.5):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
            return
        if path in ("/trickle", "/big", "/big-declared", "/small"):
            body = b"x" * (4096 if path.startswith("/big") else 10)
            self.send_response(200)
            if path == "/big":
                self.send_header("Connection", "close")
                self.close_connection = True
            else:
                self.send_header("Content-Length", str(len(body) * (1000 if path == "/big-declared" else 1)))
            self.end_headers()
            with contextlib.suppress(OSError):
                if path == "/trickle":
                    for byte in body:
                        if self.stop.wait(0.5):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                elif path == "/small":
                    self.wfile.write(body)
                else:
                    for _ in range(1000):
                        self.wfile.write(body)
            return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _early_hints(self, path: str) -> None:
        """Interim answers on the raw socket (http.server writes no 1xx of its own): one 103 Early Hints
        and a 100 Continue before the real 200; or 103s without end, at once (`-flood`) or one every
        0.2 s (`-forever`): neither may ever be the answer, and both end at the cap or the deadline."""
        hint = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload; as=style\r\n\r\n"
        final = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nfinal"
        self.close_connection = True
        with contextlib.suppress(OSError):
            if path == "/early-hints":
                self.wfile.write(hint + b"HTTP/1.1 100 Continue\r\n\r\n" + hint)
                self.wfile.flush()
                if not self.stop.wait(0.1):  # the final answer in a packet of its own, too
                    self.wfile.write(final)
                return
            while not self.stop.is_set():
                self.wfile.write(hint * (100 if path == "/early-hints-flood" else 1))
                self.wfile.flush()
                if path == "/early-hints-forever" and self.stop.wait(0.2):
                    return

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Any:
    with serving(_Handler) as base:
        yield base
        _Handler.stop.set()


@pytest.mark.parametrize("path", ["/silent", "/trickle", "/trickle-headers"])
def test_the_deadline_covers_the_whole_request(url: str, path: str) -> None:
    started = time.monotonic()
    reply = fetch(url + path, deadline_s=1.0, max_bytes=1024)
    took = time.monotonic() - started
    assert reply.failure == "deadline" and reply.problem == "no complete answer within 1 s", reply
    assert took < 1.0 + SLACK_S, took


def test_a_body_over_the_cap_is_stopped_there_declared_or_not(url: str) -> None:
    streamed = fetch(url + "/big", deadline_s=10, max_bytes=64 * 1024)
    assert streamed.failure == "too_big" and "over the 64 KiB cap (reading stopped there)" in streamed.problem
    assert streamed.body == b""  # nothing half-read is handed on
    declared = fetch(url + "/big-declared", deadline_s=10, max_bytes=64 * 1024)
    assert declared.failure == "too_big" and "4,096,000 bytes, over the 64 KiB cap" in declared.problem


def test_a_whole_answer_and_a_refusal(url: str) -> None:
    reply = fetch(url + "/small", deadline_s=10, max_bytes=1024)
    assert reply.ok and reply.status == 200 and reply.body == b"x" * 10
    assert fetch(url + "/nothing", deadline_s=10, max_bytes=1024).status == 404
    with serving(_Handler) as gone:
        pass  # nothing listens there any more
    refused = fetch(gone, deadline_s=5, max_bytes=1024)
    assert refused.failure == "transport" and "Connection refused" in refused.problem
    assert fetch("ftp://x/", deadline_s=1, max_bytes=1).failure == "transport"
    assert fetch("http://127.0.0.1:99999/", deadline_s=1, max_bytes=1).problem.startswith("bad URL")


def test_an_interim_103_or_100_answer_is_skipped_and_the_final_answer_read(url: str) -> None:
    """A `103 Early Hints` was taken for the answer: status 103, an empty body, the real 200 never read."""
    reply = fetch(url + "/early-hints", deadline_s=10, max_bytes=1024)
    assert reply.ok and reply.status == 200 and reply.body == b"final", reply
    assert health_ok(url + "/early-hints", timeout_s=5.0)


def test_interim_answers_without_end_stop_at_the_cap_or_the_deadline(url: str) -> None:
    started = time.monotonic()
    flood = fetch(url + "/early-hints-flood", deadline_s=30, max_bytes=1024 * 1024)
    assert flood.failure == "too_big" and "interim (1xx) answers" in flood.problem, flood
    assert flood.status is None and time.monotonic() - started < SLACK_S
    started = time.monotonic()
    slow = fetch(url + "/early-hints-forever", deadline_s=1.0, max_bytes=1024 * 1024)
    assert slow.failure == "deadline" and slow.status is None, slow
    assert time.monotonic() - started < 1.0 + SLACK_S
    assert not health_ok(url + "/early-hints-forever", timeout_s=1.0)


def test_health_ok_is_bounded_too(url: str) -> None:
    started = time.monotonic()
    assert not health_ok(url + "/trickle", timeout_s=1.0)
    assert time.monotonic() - started < 1.0 + SLACK_S
    assert health_ok(url + "/small", timeout_s=5.0)


def test_caps_are_described_in_words() -> None:
    assert [describe_cap(n) for n in (16 * 1024 * 1024, 64 * 1024, 1000)] == [
        "16 MiB",
        "64 KiB",
        "1000 bytes",
    ]
    assert Reply(body=b"\xff").text == "\ufffd"
