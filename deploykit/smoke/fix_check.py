"""Smoke's fix check: read `GET /deploykit/status` from a running server and compare it with the fixes the
plan expects. A planned fix that is not active fails the verdict, naming the fix and the likely cause.

Active means in every rank: with tensor or pipeline parallelism, and across nodes, each rank is a process
with its own environment, so the check names the rank that did not apply a fix and fails when fewer ranks
answered than the engine's world holds.

The server side runs inside vLLM (the plugin's status route); this side only speaks HTTP, and the two share
only the route's path, the RPC's name and the per-rank record (`deploykit.plugin_contract`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from deploykit.plugin_contract import STATUS_PATH as STATUS_PATH
from deploykit.plugin_contract import STATUS_RPC_METHOD, RankStatus, WorldShape, unanswered_ranks
from deploykit.smoke.judge import summarise
from deploykit.smoke.models import CaseResult

if TYPE_CHECKING:
    from deploykit.endpoint import Endpoint
    from deploykit.smoke.models import SmokeReport, SmokeRequest

CASE_NAME = "fixes"
NONE_WORD = "none"
PLUGIN_NOT_LOADED = "deploykit's plugin is not loaded by this server"
# A diagnosis names this many ranks at most (a 64-rank world lacking a fix everywhere is one line, not 64).
MAX_RANKS_NAMED = 4
STATUS_DEADLINE_S = 60.0
"""The most seconds a read of the status route waits, whatever the endpoint's request deadline."""


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
    ranks: list[RankStatus] | None = Field(
        default=None, description="each engine rank's answer; None: the server listed none (older deploykit)"
    )
    world_size: int | None = Field(default=None, description="ranks in the engine's world; None: unknown")
    ranks_problem: str | None = Field(default=None, description="why the per-rank answer could not be read")
    detail: str = ""
    latency_s: float = 0.0


_RANKS = TypeAdapter(list[RankStatus])


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


def read_status(endpoint: Endpoint, *, timeout_s: float | None = None) -> ServerFixStatus:
    """GET the status route with the server's API key (the route answers 401 without it when the server has
    one), within `timeout_s` (default: the endpoint's request deadline, at most STATUS_DEADLINE_S: the
    route answers at once or not at all); never raises for HTTP trouble."""
    import json

    from deploykit.http_bounded import LISTING_CAP_BYTES, fetch

    deadline_s = timeout_s if timeout_s is not None else min(endpoint.request_deadline_s, STATUS_DEADLINE_S)
    reply = fetch(
        endpoint.at(STATUS_PATH),
        headers=endpoint.headers(),
        deadline_s=deadline_s,
        max_bytes=LISTING_CAP_BYTES,
    )
    elapsed = reply.elapsed_s
    if not reply.ok:
        from deploykit.net import redact_text  # an exception's text can carry the URL or a header value

        return ServerFixStatus(
            route="error",
            http_status=reply.status,
            detail=redact_text(reply.problem, endpoint.secrets),
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
            if endpoint.api_key
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
    ranks, world_size, problem = _ranks_and_world(body)
    return ServerFixStatus(
        route="ok",
        http_status=200,
        fixes_requested=[str(n) for n in requested] if isinstance(requested, list) else [],
        fixes_active={str(k): str(v) for k, v in active.items()} if isinstance(active, dict) else {},
        engine_error=None if engine_error is None else str(engine_error)[:500],
        ranks=ranks,
        world_size=world_size,
        ranks_problem=problem,
        latency_s=elapsed,
    )


def _ranks_and_world(body: dict[str, Any]) -> tuple[list[RankStatus] | None, int | None, str | None]:
    """The per-rank records (`engine`) and the world's size (`world`), each checked against the shared
    schema. Absent is unknown (an older deploykit's route); present and malformed is a problem the check
    fails on, because a rank that cannot be read cannot be shown to have its fixes."""
    ranks: list[RankStatus] | None = None
    world_size: int | None = None
    problems: list[str] = []
    if "engine" in body:
        try:
            ranks = _RANKS.validate_python(body["engine"])
        except ValidationError as exc:
            problems.append(_first_error("engine", exc))
    if body.get("world") is not None:
        try:
            world_size = WorldShape.model_validate(body["world"]).size
        except ValidationError as exc:
            problems.append(_first_error("world", exc))
    return ranks, world_size, "; ".join(problems) or None


def _first_error(field: str, exc: ValidationError) -> str:
    """`engine.0.rank: Input should be a valid integer`: where, in the body, and what (bounded)."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in (field, *error["loc"]))
    return f"{where}: {error['msg']}"[:200]


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
        if name not in status.fixes_requested:
            requested = ",".join(status.fixes_requested) or "(empty)"
            causes[name] = f"not requested: the server's DEPLOYKIT_FIXES is {requested}"
        elif status.engine_error:
            causes[name] = _engine_cause(status.engine_error)
        else:
            why = _rank_cause(name, status)
            if why is not None:
                causes[name] = why
            elif name not in active:
                causes[name] = "requested, but not every engine worker reports it applied"
    return causes


def _engine_cause(engine_error: str) -> str:
    cause = f"requested, but the engine did not answer: {engine_error}"
    if f"has no attribute '{STATUS_RPC_METHOD}'" in engine_error:  # vLLM's words for a rank without it
        cause += (
            " (an engine rank has no deploykit status method: deploykit's plugin is not active in its vLLM; "
            "in a multi-node world every node needs deploykit installed and DEPLOYKIT_FIXES set)"
        )
    return cause


def _rank_cause(name: str, status: ServerFixStatus) -> str | None:
    """Why the ranks' own answers show `name` is not active in every rank, or None when they show nothing
    wrong (or the server listed no ranks)."""
    if status.ranks_problem is not None:
        return f"requested, but the server's per-rank answer is malformed: {status.ranks_problem}"
    ranks = status.ranks
    if ranks is None:
        return None
    if status.world_size is not None:
        missing = unanswered_ranks(status.world_size, (r.rank for r in ranks))
        if missing:
            answered = status.world_size - len(missing)
            return (
                f"requested, but only {answered} of the engine's {status.world_size} ranks answered "
                f"(no answer from {_rank_list(missing)})"
            )
    lacking = [rank for rank in ranks if name not in rank.fixes_applied]
    if not lacking:
        return None
    named = [_did_not_apply(name, rank) for rank in lacking[:MAX_RANKS_NAMED]]
    more = len(lacking) - len(named)
    either = f" and {more} more rank(s) did not either" if more else ""
    return "requested, but " + " and ".join(named) + either


def _rank_list(ranks: list[int]) -> str:
    shown = ", ".join(str(rank) for rank in ranks[:MAX_RANKS_NAMED])
    more = f" and {len(ranks) - MAX_RANKS_NAMED} more" if len(ranks) > MAX_RANKS_NAMED else ""
    return ("rank " if len(ranks) == 1 else "ranks ") + shown + more


def _did_not_apply(name: str, rank: RankStatus) -> str:
    """`rank 1 (tp 1, pp 0, node 1, host b) did not apply it`, with the rank's own DEPLOYKIT_FIXES when that
    says why (a node started with another environment)."""
    words = f"{rank.label()} did not apply it"
    if rank.fixes_requested is not None and name not in rank.fixes_requested:
        words += f" (its DEPLOYKIT_FIXES is {','.join(rank.fixes_requested) or '(empty)'})"
    return words


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
    endpoint: Endpoint,
    requests: Sequence[SmokeRequest],
    *,
    expected: Sequence[str],
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
        endpoint,
        requests,
        special_ids=special_ids,
        vocab_size=vocab_size,
        on_case=on_case,
        tie_tolerance=tie_tolerance,
        logprob_tolerance=logprob_tolerance,
    )
    status = read_status(endpoint)
    if expected:
        case = fix_case(expected, status)
        if on_case is not None:
            on_case(case)
        report = summarise([*report.cases, case], report.elapsed_s)
    return report, status
