"""Smoke's fix check: read `GET /deploykit/status` from a running server and compare it with the fixes the
plan expects. A planned fix that is not active fails the verdict, naming the fix and the likely cause.

The server side runs inside vLLM (the plugin's status route); this side only speaks HTTP, and the two share
only the route's path (`deploykit.plugin_contract`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deploykit.plugin_contract import STATUS_PATH as STATUS_PATH
from deploykit.smoke.judge import summarise
from deploykit.smoke.models import CaseResult

if TYPE_CHECKING:
    from deploykit.smoke.models import SmokeReport, SmokeRequest

CASE_NAME = "fixes"
NONE_WORD = "none"
PLUGIN_NOT_LOADED = "deploykit's plugin is not loaded by this server"


class ServerFixStatus(BaseModel):
    """What the status route said: `route` is ok, missing (404: no plugin) or error (unreachable, 5xx)."""

    model_config = ConfigDict(extra="forbid")

    route: Literal["ok", "missing", "error"]
    http_status: int | None = None
    fixes_requested: list[str] = Field(default_factory=list)
    fixes_active: dict[str, str] | None = Field(
        default=None, description="fix → patched target; {} when the plugin is not loaded; None if unknown"
    )
    engine_error: str | None = None
    detail: str = ""
    latency_s: float = 0.0


def parse_expect_fixes(text: str, known: Iterable[str]) -> list[str]:
    """`NAME[,NAME]` (or `none`) → names; an unknown name raises ValueError naming the known ones."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if names == [NONE_WORD]:
        return []
    known_names = list(known)
    unknown = [name for name in names if name not in known_names]
    if unknown:
        raise ValueError(
            f"--expect-fixes names unknown fix(es) {', '.join(unknown)}; known fixes: "
            f"{', '.join(known_names)} (or `{NONE_WORD}`)"
        )
    return list(dict.fromkeys(names))


def read_status(base_url: str, *, timeout_s: float = 30.0, api_key: str | None = None) -> ServerFixStatus:
    """GET the status route with the server's API key (the route answers 401 without it when the server has
    one); never raises for HTTP trouble."""
    import json

    from deploykit.http_bounded import LISTING_CAP_BYTES, fetch

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    reply = fetch(
        base_url.rstrip("/") + STATUS_PATH, headers=headers, deadline_s=timeout_s, max_bytes=LISTING_CAP_BYTES
    )
    elapsed = reply.elapsed_s
    if not reply.ok:
        from deploykit.net import redact_text  # an exception's text can carry the URL or a header value

        return ServerFixStatus(
            route="error",
            http_status=reply.status,
            detail=redact_text(reply.problem, [api_key or ""]),
            latency_s=elapsed,
        )
    response_status = reply.status or 0
    if response_status == 404:
        return ServerFixStatus(route="missing", http_status=404, fixes_active={}, latency_s=elapsed)
    try:
        body: Any = json.loads(reply.text)
    except (ValueError, RecursionError):
        body = None
    if response_status == 401:  # the route is guarded like /v1 when the server has an API key
        why = (
            "the key sent was refused"
            if api_key
            else "no key was sent (name its variable: --api-key-env VAR or the profile's serve.api_key_env)"
        )
        return ServerFixStatus(
            route="error",
            http_status=401,
            detail=f"HTTP 401: the server requires its API key; {why}",
            latency_s=elapsed,
        )
    if response_status != 200 or not isinstance(body, dict):
        return ServerFixStatus(
            route="error",
            http_status=response_status,
            detail=f"HTTP {response_status}: {reply.text[:200]}",
            latency_s=elapsed,
        )
    active = body.get("fixes_active")
    requested = body.get("fixes_requested")
    engine_error = body.get("engine_error")
    return ServerFixStatus(
        route="ok",
        http_status=200,
        fixes_requested=[str(n) for n in requested] if isinstance(requested, list) else [],
        fixes_active={str(k): str(v) for k, v in active.items()} if isinstance(active, dict) else {},
        engine_error=None if engine_error is None else str(engine_error)[:500],
        latency_s=elapsed,
    )


def missing_fix_causes(expected: Sequence[str], status: ServerFixStatus) -> dict[str, str]:
    """Each expected fix that is not active → the likely cause, in words."""
    if status.route == "missing":
        cause = (
            f"{PLUGIN_NOT_LOADED} (GET {STATUS_PATH} answered 404): install deploykit beside vLLM "
            "(docs/deploy.md) and start vLLM with DEPLOYKIT_FIXES naming the fix"
        )
        return dict.fromkeys(expected, cause)
    if status.route == "error":
        return dict.fromkeys(expected, f"the status route could not be read: {status.detail}")
    active = status.fixes_active or {}
    causes = {}
    for name in expected:
        if name in active:
            continue
        if name not in status.fixes_requested:
            requested = ",".join(status.fixes_requested) or "(empty)"
            causes[name] = f"not requested: the server's DEPLOYKIT_FIXES is {requested}"
        elif status.engine_error:
            causes[name] = f"requested, but the engine did not answer: {status.engine_error}"
        else:
            causes[name] = "requested, but not every engine worker reports it applied"
    return causes


def fix_case(expected: Sequence[str], status: ServerFixStatus) -> CaseResult:
    """The fix check as one smoke case, so it lands in the verdict and the stored row like the others."""
    causes = missing_fix_causes(expected, status)
    if causes:
        diagnosis = "expected fix(es) not active: " + "; ".join(f"{n}: {why}" for n, why in causes.items())
    else:
        diagnosis = ""
    active = status.fixes_active or {}
    return CaseResult(
        name=CASE_NAME,
        kind=CASE_NAME,
        endpoint=STATUS_PATH,
        model="-",
        passed=not causes,
        diagnosis=diagnosis,
        http_status=status.http_status,
        latency_s=round(status.latency_s, 4),
        text=", ".join(f"{n} → {t}" for n, t in active.items()) or None,
    )


def smoke_with_fix_check(
    base_url: str,
    requests: Sequence[SmokeRequest],
    *,
    expected: Sequence[str],
    timeout_s: float,
    api_key: str | None,
    special_ids: frozenset[int],
    tie_tolerance: float,
    logprob_tolerance: float,
    on_case: Callable[[CaseResult], None] | None = None,
    vocab_size: int | None = None,
) -> tuple[SmokeReport, ServerFixStatus]:
    """The smoke cases, then the fix check as one more case: what `serve` and `smoke` both judge a server by.

    The status is read even when no fix is expected, so the stored row says what the server has active.
    """
    from deploykit.smoke import client  # looked up per call: a test replaces `client.run_smoke`

    report = client.run_smoke(
        base_url,
        requests,
        timeout_s=timeout_s,
        api_key=api_key,
        special_ids=special_ids,
        vocab_size=vocab_size,
        on_case=on_case,
        tie_tolerance=tie_tolerance,
        logprob_tolerance=logprob_tolerance,
    )
    status = read_status(base_url, timeout_s=min(timeout_s, 60.0), api_key=api_key)
    if expected:
        case = fix_case(expected, status)
        if on_case is not None:
            on_case(case)
        report = summarise([*report.cases, case], report.elapsed_s)
    return report, status
