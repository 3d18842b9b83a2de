"""Hosts, URLs and ports for IPv4 and IPv6: one module, and what serve and render build from it."""

from __future__ import annotations

import http.server
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from deploykit import net
from tests.http_server import serving


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")


@pytest.mark.parametrize(
    ("bind_host", "client", "url"),
    [
        ("127.0.0.1", "127.0.0.1", "http://127.0.0.1:8000"),
        ("0.0.0.0", "127.0.0.1", "http://127.0.0.1:8000"),
        ("", "127.0.0.1", "http://127.0.0.1:8000"),
        ("10.0.0.2", "10.0.0.2", "http://10.0.0.2:8000"),
        ("::1", "::1", "http://[::1]:8000"),
        ("[::1]", "::1", "http://[::1]:8000"),
        ("::", "::1", "http://[::1]:8000"),
        ("fd00::5", "fd00::5", "http://[fd00::5]:8000"),
        ("localhost", "localhost", "http://localhost:8000"),
        ("gpu-7.internal", "gpu-7.internal", "http://gpu-7.internal:8000"),
    ],
)
def test_client_host_and_base_url(bind_host: str, client: str, url: str) -> None:
    assert net.client_host(bind_host) == client
    assert net.base_url(bind_host, 8000) == url


def test_url_host_brackets_ipv6_only() -> None:
    assert net.url_host("::1") == net.url_host("[::1]") == "[::1]"
    assert net.url_host("127.0.0.1") == "127.0.0.1"
    assert net.url_host("example.org") == "example.org"
    assert net.health_url("http://[::1]:8000/") == "http://[::1]:8000/health"


@pytest.mark.parametrize(
    ("host", "beyond"),
    [
        ("127.0.0.1", False),
        ("::1", False),
        ("localhost", False),
        ("0.0.0.0", True),
        ("::", True),
        ("", True),
        ("10.0.0.2", True),
        ("fd00::5", True),
        ("gpu-7.internal", True),
    ],
)
def test_listens_beyond_loopback(host: str, beyond: bool) -> None:
    assert net.listens_beyond_loopback(host) is beyond


def test_wildcards_and_families() -> None:
    assert net.is_wildcard("0.0.0.0") and net.is_wildcard("::") and net.is_wildcard("")
    assert not net.is_wildcard("127.0.0.1") and not net.is_wildcard("localhost")
    assert net.is_ipv6("::1") and net.is_ipv6("[::]") and not net.is_ipv6("127.0.0.1")
    assert net.ip_address("example.org") is None


@contextmanager
def _listening(family: socket.AddressFamily, host: str) -> Iterator[int]:
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_port_in_use_ipv4_and_the_ipv4_wildcard() -> None:
    with _listening(socket.AF_INET, "127.0.0.1") as port:
        assert net.port_in_use(port, "127.0.0.1")
        assert net.port_in_use(port, "0.0.0.0")  # a wildcard bind collides with any address's listener
        assert net.port_in_use(port, "")
    assert not net.port_in_use(port, "127.0.0.1")


@needs_ipv6
def test_port_in_use_ipv6_and_the_ipv6_wildcard() -> None:
    with _listening(socket.AF_INET6, "::1") as port:
        assert net.port_in_use(port, "::1")
        assert net.port_in_use(port, "[::1]")
        assert net.port_in_use(port, "::")
    assert not net.port_in_use(port, "::1")
    with _listening(socket.AF_INET, "127.0.0.1") as port:
        assert net.port_in_use(port, "::")  # `::` takes the IPv4 wildcard too (dual stack)


def test_port_in_use_for_a_name_resolves_it() -> None:
    with _listening(socket.AF_INET, "127.0.0.1") as port:
        assert net.port_in_use(port, "localhost")
    assert not net.port_in_use(port, "no-such-host.invalid")


def test_an_address_this_machine_lacks_is_not_in_use() -> None:
    assert not net.port_in_use(net.free_port(), "192.0.2.1")  # TEST-NET-1: never a local address


@needs_ipv6
def test_free_port_for_either_family() -> None:
    for host, family in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
        port = net.free_port(host)
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, port))


@needs_ipv6
def test_health_ok_over_ipv6() -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler, host="::1") as served:
        port = served.server.server_port
        url = net.base_url("::", port)
        assert url == f"http://[::1]:{port}" == served
        assert net.health_ok(net.health_url(url))
        assert not net.health_ok(f"{url}/nope")
    assert not net.health_ok(net.health_url(url), timeout_s=0.5)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
        ("http://user:S3cret@127.0.0.1:8000", "http://user:***@127.0.0.1:8000"),
        ("postgresql://u@host/db?password=S3cret", "postgresql://u@host/db?password=***"),
        ("postgresql://u:S3cret@host:notaport/db", "postgresql://u:***@host:notaport/db"),
        ("postgresql://u:S3c@:/%ret@host:5432/db", "postgresql://u:***@host:5432/db"),
        ("postgresql://u:S3c/ret?x@host/db", "postgresql://u:***@host/db"),
        ("postgresql://u:S3c#ret@host/db", "postgresql://u:***@host/db"),
        ("postgresql://u:pw@h/db?application_name=a@b", "postgresql://u:***@h/db?application_name=a@b"),
        (
            "postgresql://u:pw@h/db?sslmode=require&sslpassword=S3cret",
            "postgresql://u:***@h/db?sslmode=require&sslpassword=***",
        ),
        ("https://h/x?token=S3cret&model=m", "https://h/x?token=***&model=m"),
        ("sqlite:////tmp/results.sqlite", "sqlite:////tmp/results.sqlite"),
        ("/tmp/results.sqlite", "/tmp/results.sqlite"),
    ],
)
def test_redact_url_hides_every_password_even_in_urls_that_do_not_parse(url: str, shown: str) -> None:
    assert net.redact_url(url) == shown
    assert "S3c" not in net.redact_url(url)


def test_redact_urls_in_text_redacts_each_url_it_holds() -> None:
    text = "cannot reach http://u:S3cret@h:1/x (from postgresql://a:S3cret@b/c)"
    assert net.redact_urls_in(text) == "cannot reach http://u:***@h:1/x (from postgresql://a:***@b/c)"


# --- the one redactor for exception texts, and secrets read from the environment (issue 30) -------------

KEY = "sk-live-0123456789abcdefXYZ"


@pytest.mark.parametrize(
    "text",
    [
        # httpx's refusal of a header value ending in a line break, as it reached the terminal and the store
        f"LocalProtocolError: Illegal header value b'Bearer {KEY}\\n'",
        f"Illegal header value b'Bearer {KEY}\\r'",
        repr({"Authorization": f"Bearer {KEY}\n"}),  # a dict of headers in a message
        repr({b"authorization": f"Bearer {KEY}\r\n".encode()}),
        repr([("x-api-key", KEY)]),
        f"Authorization: Bearer {KEY}",
        f"ConnectError: http://user:{KEY}@127.0.0.1:1/v1/completions",
        f"GET http://127.0.0.1:1/v1/models?api_key={KEY} failed",
    ],
)
def test_redact_text_hides_header_values_urls_and_reprs(text: str) -> None:
    shown = net.redact_text(text)
    assert KEY not in shown and "0123456789abcdef" not in shown
    assert net.REDACTED in shown


def test_redact_text_hides_a_known_secret_raw_and_as_a_repr_shows_it() -> None:
    secret = f"{KEY}\n"
    for text in (f"got {secret} back", f"got {secret!r} back", f"got {secret.encode()!r} back", f"x {KEY} y"):
        assert KEY not in net.redact_text(text, [secret])


def test_redact_text_leaves_plain_diagnoses_alone() -> None:
    text = "generated token 0 (a special/pad token) at position 3; max_tokens=16, prompt_tokens: 512"
    assert net.redact_text(text) == text


@pytest.mark.parametrize(
    ("value", "words"),
    [
        (f"{KEY}\n", ["ends with", "U+000A", "--from-file"]),
        (f"{KEY}\r\n", ["ends with", "U+000D"]),
        (f"{KEY}\r", ["ends with", "U+000D"]),
        (f"sk-\n{KEY}", ["holds", "U+000A"]),
        (f"{KEY}\x00", ["U+0000"]),
        (f"{KEY}é", ["non-ASCII"]),
    ],
)
def test_a_secret_that_cannot_travel_in_a_header_is_refused_naming_only_the_variable(
    value: str, words: list[str]
) -> None:
    with pytest.raises(net.SecretRefused) as caught:
        net.secret_from_env("DK_KEY", {"DK_KEY": value})
    message = str(caught.value)
    assert "\n" not in message and "DK_KEY" in message and "not shown" in message
    assert KEY not in message and "sk-" not in message
    assert all(word in message for word in words), message


def test_a_plain_secret_is_given_back_unchanged() -> None:
    assert net.secret_from_env("DK_KEY", {"DK_KEY": KEY}) == KEY
    assert net.secret_from_env("DK_KEY", {}) is None
    assert net.secret_from_env("DK_KEY", {"DK_KEY": ""}) is None
