"""Hosts, URLs and ports, IPv4 and IPv6 alike, and the one /health check: the only place that knows them.

A server binds a *bind host* (`127.0.0.1`, `::1`, `0.0.0.0`, `::`, a name); a client on the same machine
reaches it at the *client host* (a wildcard becomes the loopback of its family); a URL puts an IPv6
literal in brackets (`http://[::1]:8000`). Standard library only and cheap to import: serve, smoke,
render and the systemd unit's `wait_health` (run in the service's sandbox) all use it.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Mapping, Sequence

from deploykit.untrusted_text import control_character

LOOPBACK_V4 = "127.0.0.1"
LOOPBACK_V6 = "::1"
WILDCARD_V4 = "0.0.0.0"


def ip_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address `host` spells (an IPv6 one with or without brackets); None for a host name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None  # a host name


def is_ipv6(host: str) -> bool:
    address = ip_address(host)
    return address is not None and address.version == 6


def is_wildcard(host: str) -> bool:
    """Binds every address: `0.0.0.0`, `::` (or no host at all)."""
    address = ip_address(host)
    return host == "" or (address is not None and address.is_unspecified)


def client_host(bind_host: str) -> str:
    """Where a client on this machine reaches a server bound to `bind_host`: 0.0.0.0 → 127.0.0.1, :: → ::1."""
    if is_wildcard(bind_host):
        return LOOPBACK_V6 if is_ipv6(bind_host) else LOOPBACK_V4
    return bind_host.strip("[]") if is_ipv6(bind_host) else bind_host


def url_host(host: str) -> str:
    """The host as it stands in a URL: an IPv6 literal in brackets."""
    bare = host.strip("[]")
    return f"[{bare}]" if is_ipv6(bare) else bare


def base_url(bind_host: str, port: int, scheme: str = "http") -> str:
    """The URL a client on this machine uses for a server bound to `bind_host`:`port`."""
    return f"{scheme}://{url_host(client_host(bind_host))}:{port}"


def listens_beyond_loopback(bind_host: str) -> bool:
    """Reachable from other machines: a wildcard, a non-loopback address or any name but `localhost`."""
    if is_wildcard(bind_host):
        return True
    address = ip_address(bind_host)
    if address is None:
        return bind_host != "localhost"
    return not address.is_loopback


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if is_ipv6(host) else socket.AF_INET


def _bind_addresses(host: str, port: int) -> list[tuple[socket.AddressFamily, str]]:
    """The (family, address) pairs a server bound to `host` takes; a name is resolved."""
    if host == "":
        host = WILDCARD_V4
    if ip_address(host) is not None:
        return [(_family(host), host.strip("[]"))]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []  # unresolvable: the server's own bind error says so
    return list(dict.fromkeys((family, str(sockaddr[0])) for family, _, _, _, sockaddr in infos))


def port_in_use(port: int, host: str = LOOPBACK_V4) -> bool:
    """Would a server fail to bind `host`:`port` because something already holds it?

    Works for IPv4 and IPv6 addresses, wildcards (`0.0.0.0`, and `::`, which on Linux also takes the IPv4
    wildcard) and names. Only "address in use" counts: an address this machine does not have is the
    server's to report."""
    for family, address in _bind_addresses(host, port):
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((address, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return True
    return False


def free_port(host: str = LOOPBACK_V4) -> int:
    """A port the kernel says is free on `host` (IPv4 or IPv6) right now."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.bind((host.strip("[]"), 0))
        return int(sock.getsockname()[1])


def health_url(url: str) -> str:
    """A server's /health URL from its base URL."""
    return f"{url.rstrip('/')}/health"


def health_ok(url: str, timeout_s: float = 5.0) -> bool:
    """Does `url` (a /health URL) answer 200, all of it within `timeout_s` (a server that trickles bytes
    is as down as one that hangs) and within `http_bounded.HEALTH_CAP_BYTES`?"""
    from deploykit.http_bounded import HEALTH_CAP_BYTES, fetch  # here: `render` and `plan` do not need it

    reply = fetch(url, deadline_s=timeout_s, max_bytes=HEALTH_CAP_BYTES)
    return reply.ok and reply.status == 200


def server_url_problem(url: str) -> str | None:
    """What makes `url` no server base URL (`smoke --url`, `canary --url`): not http(s), no host, or a port
    outside 1-65535; None when it is one."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{exc} (ports are 1-65535)"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "expected http://HOST:PORT, e.g. http://127.0.0.1:8000"
    if port == 0:
        return "port 0 is not a port a server listens on (ports are 1-65535)"
    return None


# --- redaction --------------------------------------------------------------------------------------

_SECRET_QUERY_KEY = re.compile(r"pass|secret|token|key|auth|credential|signature", re.IGNORECASE)
REDACTED = "***"


def redact_url(url: str) -> str:
    """`url` with its password and secret query values as `***`, for every URL deploykit prints or stores.

    Written for hostile input rather than parsed with urllib: a URL whose port is not a number, or whose
    raw password holds `@ : / %`, is still redacted (everything between `://` and the last `@` before the
    query is user info), and the result never contains the original through a repr."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url  # a bare path holds no credentials
    before_at = rest.partition("@")[0]
    plain_head = rest.partition("?")[0].partition("#")[0]
    if "@" in rest and "@" not in plain_head and ":" in before_at and "=" not in before_at:
        # A raw `/`, `?` or `#` in the password: the user info runs to the last `@` (erring on the side of
        # hiding too much: a path or fragment holding `:` and `@` loses its middle).
        user_info, _, rest = rest.rpartition("@")
        user = user_info.partition(":")[0]
        return f"{scheme}://{user}:{REDACTED}@{redact_url('x://' + rest)[4:]}"
    head, qmark, query = rest.partition("?")
    query, hash_mark, fragment = query.partition("#")
    if not qmark:
        head, hash_mark, fragment = rest.partition("#")
    user_info, at, host_and_path = head.rpartition("@")
    if at:
        user, colon, _password = user_info.partition(":")
        head = f"{user}:{REDACTED}@{host_and_path}" if colon else f"{user}@{host_and_path}"
    if qmark:
        query = "&".join(_redact_query_item(item) for item in query.split("&"))
    return f"{scheme}://{head}{qmark}{query}{hash_mark}{fragment}"


def _redact_query_item(item: str) -> str:
    key, eq, value = item.partition("=")
    return f"{key}={REDACTED}" if eq and value and _SECRET_QUERY_KEY.search(key) else item


_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def redact_urls_in(text: str) -> str:
    """`text` (a driver's error message, say) with every URL in it passed through `redact_url`."""
    return _URL_IN_TEXT.sub(lambda match: redact_url(match.group()), text)


# Header values as they stand in an exception's text or a repr: `Bearer TOKEN` (also inside b'...' or
# '...'), and the value of any authorization-like header or key (`Authorization: x`, `'api-key': 'x'`).
_BEARER = re.compile(r"(?i)\b(bearer|basic)(\s+|\\x20|%20)[^\s'\"<>,;)}\]]+")
_AUTH_VALUE = re.compile(
    r"(?i)(\b(?:proxy-)?(?:authorization|x-api-key|api-key|cookie|set-cookie)(?:['\"]?\s*[:=]|['\"],)\s*(?:b?['\"])?)"
    r"([^'\"\s,;)}\]]+)"
)


def redact_text(text: str, secrets: Sequence[str] = ()) -> str:
    """`text` (an exception's message, a log line, a diagnosis) as deploykit may print or store it: every
    URL through `redact_url`, every `Bearer ...` and authorization-like header value as `***`, and every
    known secret as `***`, raw or as a repr shows it (`\\n` escaped, `b'...'`)."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        for form in {
            secret,
            secret.strip(),
            repr(secret)[1:-1],
            repr(secret.encode("utf-8", "replace"))[2:-1],
        }:
            if len(form) >= 4:
                text = text.replace(form, REDACTED)
    text = redact_urls_in(text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _AUTH_VALUE.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


class SecretRefused(ValueError):
    """A secret read from the environment cannot be sent as it is; the message names the variable only."""


def secret_from_env(name: str, environ: Mapping[str, str], what: str = "API key") -> str | None:
    """The value of `name` (None when unset or empty), refused when it could not travel in an HTTP header
    unchanged: a control character (a trailing `\\n` or `\\r\\n` is what `kubectl create secret
    --from-file` and a CRLF env file leave) or a non-ASCII character. The message never shows the value."""
    value = environ.get(name)
    if not value:
        return None
    found = control_character(value)
    if found:
        stripped = value.rstrip("\r\n")
        trailing = stripped != value and not control_character(stripped)
        where = "ends with" if trailing else "holds"
        hint = (
            " (a line break at the end is what `kubectl create secret --from-file` or a CRLF env file leaves:"
            " write the value without it)"
            if trailing
            else ""
        )
        raise SecretRefused(
            f"the {what} variable {name} {where} the control character {found}{hint}; its value is not shown"
        )
    if not value.isascii():
        raise SecretRefused(
            f"the {what} variable {name} holds a non-ASCII character, which an HTTP header cannot carry; "
            "its value is not shown"
        )
    return value
