"""A server deploykit talks to, as one value: its base URL, the API key it takes, and how long a request
and a read of its /metrics may last. Every client (smoke, fix check, trace, the canary's runs, its /metrics
reader, discovery) takes an `Endpoint`, and only `Endpoint.headers` writes the `Authorization` header, so a
key never travels as a loose parameter and never appears in a `repr`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

DEFAULT_REQUEST_DEADLINE_S = 120.0
"""Seconds one request may take, all told, when the caller gives no deadline of its own."""
DEFAULT_METRICS_DEADLINE_S = 5.0
"""Seconds one read of the server's /metrics may take."""


@dataclass(frozen=True)
class Endpoint:
    url: str
    """The base URL (`http://host:port`), without a trailing slash."""
    api_key: str | None = field(default=None, repr=False)
    request_deadline_s: float = DEFAULT_REQUEST_DEADLINE_S
    metrics_deadline_s: float = DEFAULT_METRICS_DEADLINE_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", self.url.rstrip("/"))
        if self.api_key == "":
            object.__setattr__(self, "api_key", None)

    def headers(self) -> dict[str, str]:
        """The request headers the server needs: its key as a Bearer token, when it takes one."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def at(self, path: str) -> str:
        """The full URL of `path` (`/v1/models`, `/metrics`) on this server."""
        return self.url + (path if path.startswith("/") else "/" + path)

    def with_key(self, api_key: str | None) -> Endpoint:
        """The same server with another key (a key file rotated under a running canary)."""
        return replace(self, api_key=api_key or None)

    def with_request_deadline(self, seconds: float) -> Endpoint:
        return replace(self, request_deadline_s=seconds)

    @property
    def shown(self) -> str:
        """The URL as it may be printed or stored: credentials and query redacted."""
        from deploykit.net import redact_url

        return redact_url(self.url)

    @property
    def secrets(self) -> list[str]:
        """What must never be shown: the key, for redacting a server's or an exception's text."""
        return [self.api_key] if self.api_key else []
