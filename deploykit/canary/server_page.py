"""The one read of the server's `/metrics` per tick: vLLM's NaN counter and its progress counters come from
the same page, so the page is fetched once (bounded: `endpoint.metrics_deadline_s`, `METRICS_CAP_BYTES`)
and both readings are made from its text. When the progress counters stand still, `/is_paused` is asked
too (a paused engine is quiet on purpose; a server without the route cannot be paused, and is not asked
again until it restarts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from deploykit.canary.nan_counter import CounterReading, read_counter
from deploykit.canary.progress import ProgressReading, read_progress
from deploykit.endpoint import Endpoint
from deploykit.http_bounded import METRICS_CAP_BYTES

PAUSE_ANSWER_MAX_BYTES = 4096
"""`/is_paused` answers `{"is_paused": true}`: anything longer is not that answer."""


@dataclass(frozen=True)
class ServerPage:
    """What one read of /metrics said; `problem` set (and both readings None) when it could not be read."""

    nan: CounterReading | None = None
    progress: ProgressReading | None = None
    problem: str | None = None
    too_big: bool = False
    paused: bool = False
    """vLLM said `/is_paused` true (asked only when the progress counters stood still)."""

    @property
    def read(self) -> bool:
        return self.problem is None


def read_page(endpoint: Endpoint, max_bytes: int = METRICS_CAP_BYTES) -> ServerPage:
    """One bounded GET of `/metrics`, parsed for every reader."""
    from deploykit.http_bounded import fetch

    reply = fetch(
        endpoint.at("/metrics"),
        headers=endpoint.headers(),
        deadline_s=endpoint.metrics_deadline_s,
        max_bytes=max_bytes,
    )
    if not reply.ok:
        return ServerPage(
            problem=f"the server's /metrics: {reply.problem}", too_big=reply.failure == "too_big"
        )
    if reply.status != 200:
        return ServerPage(problem=f"the server's /metrics answered HTTP {reply.status}")
    return ServerPage(nan=read_counter(reply.text), progress=read_progress(reply.text))


def ask_paused(endpoint: Endpoint) -> bool | None:
    """vLLM's `/is_paused` (its development routes): True or False as it says; None when the route is not
    there or the answer is not that answer (a server that cannot be paused is never taken as paused)."""
    from deploykit.http_bounded import fetch

    reply = fetch(
        endpoint.at("/is_paused"),
        headers=endpoint.headers(),
        deadline_s=endpoint.metrics_deadline_s,
        max_bytes=PAUSE_ANSWER_MAX_BYTES,
    )
    if not reply.ok or reply.status != 200:
        return None
    try:
        body = json.loads(reply.text)
    except (ValueError, RecursionError):
        return None
    value = body.get("is_paused") if isinstance(body, dict) else None
    return value if isinstance(value, bool) else None


@dataclass
class PageReader:
    """Reads the page tick after tick, asking `/is_paused` only while the counters stand still."""

    max_bytes: int = METRICS_CAP_BYTES
    pause_route: bool | None = None
    """Whether the server has `/is_paused` (None: not asked yet)."""
    last_work: tuple[float, float] | None = None

    def read(self, endpoint: Endpoint) -> ServerPage:
        page = read_page(endpoint, self.max_bytes)
        progress = page.progress
        if progress is None:
            return page
        still = self.last_work is not None and progress.work == self.last_work
        self.last_work = progress.work
        if not still or self.pause_route is False:
            return page
        paused = ask_paused(endpoint)
        self.pause_route = paused is not None
        return ServerPage(nan=page.nan, progress=progress, paused=bool(paused))

    def forget(self) -> None:
        """A new server process: its routes and counters are looked at afresh."""
        self.pause_route = self.last_work = None
