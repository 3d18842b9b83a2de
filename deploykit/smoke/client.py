"""The smoke over HTTP: send each request (a consistency group's concurrent ones together), judge each
answer, compare each with the one it must equal. Every request is one bounded read
(`deploykit.http_bounded.fetch`): a deadline for the whole request and a cap on the answer's size."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from deploykit.endpoint import Endpoint
from deploykit.http_bounded import ANSWER_CAP_BYTES, fetch
from deploykit.smoke.consistency import DEFAULT_LOGPROB_TOLERANCE, DEFAULT_TIE_TOLERANCE, judge_consistency
from deploykit.smoke.judge import judge, summarise
from deploykit.smoke.models import CaseResult, Exchange, SmokeReport, SmokeRequest


@dataclass(frozen=True)
class Server:
    """Where the requests go and what goes with each: the endpoint (URL, key, deadline), any header of the
    caller's own (trace's X-Request-Id) and the size cap. The key's header is the endpoint's alone."""

    endpoint: Endpoint
    extra_headers: Mapping[str, str] = field(default_factory=dict)
    max_bytes: int = ANSWER_CAP_BYTES

    @property
    def headers(self) -> dict[str, str]:
        return {**self.extra_headers, **self.endpoint.headers()}


def send(server: Server, request: SmokeRequest) -> Exchange:
    """POST one request, ended at the endpoint's request deadline all told (connect to last byte) or at the
    size cap; never raises for HTTP trouble, the Exchange says what happened."""
    timeout_s = server.endpoint.request_deadline_s
    reply = fetch(
        server.endpoint.at(request.endpoint),
        method="POST",
        json_body=request.body,
        headers=server.headers,
        deadline_s=timeout_s,
        max_bytes=server.max_bytes,
    )
    exchange = Exchange(timeout_s=timeout_s, latency_s=reply.elapsed_s, status_code=reply.status)
    if reply.failure == "deadline":
        exchange.timed_out = True
    elif reply.failure == "too_big":
        exchange.too_big = reply.problem
    elif reply.failure == "transport":
        from deploykit.net import redact_text  # an exception's text can carry the URL or a header value

        exchange.transport_error = redact_text(reply.problem, server.endpoint.secrets)
    else:
        exchange.raw_text = reply.text
        try:
            exchange.body = json.loads(exchange.raw_text)  # json accepts NaN/Infinity, which the rules want
        except (ValueError, RecursionError):
            exchange.body = None
    return exchange


def judged(
    request: SmokeRequest,
    exchange: Exchange,
    special_ids: frozenset[int] = frozenset(),
    vocab_size: int | None = None,
) -> CaseResult:
    """`judge`, and a failed case (never an exception) should the answer break a rule's reading of it."""
    try:
        return judge(request, exchange, special_ids, vocab_size)
    except Exception as exc:  # the judge validates first; this is the floor under it
        return _unjudged(request, exchange, exc)


def _unjudged(request: SmokeRequest, exchange: Exchange, exc: Exception) -> CaseResult:
    return CaseResult(
        name=request.name,
        kind=request.kind,
        endpoint=request.endpoint,
        model=request.model,
        passed=False,
        http_status=exchange.status_code,
        latency_s=round(exchange.latency_s, 4),
        diagnosis=f"the answer could not be judged ({type(exc).__name__}: {str(exc)[:200]})",
    )


def batches(requests: Sequence[SmokeRequest]) -> list[list[SmokeRequest]]:
    """The sending order: one request at a time, except a group's concurrent requests, sent together."""
    out: list[list[SmokeRequest]] = []
    for request in requests:
        previous = out[-1][-1] if out else None
        if (
            request.concurrent
            and previous is not None
            and previous.concurrent
            and previous.group == request.group
        ):
            out[-1].append(request)
        else:
            out.append([request])
    return out


def run_smoke(
    endpoint: Endpoint,
    requests: Sequence[SmokeRequest],
    *,
    special_ids: frozenset[int] = frozenset(),
    vocab_size: int | None = None,
    on_case: Callable[[CaseResult], None] | None = None,
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> SmokeReport:
    """Send each request in order, each within `endpoint.request_deadline_s`, and judge it; `on_case(result)`
    is called after each. One result per request, whatever the server answered."""
    server = Server(endpoint)
    started = time.monotonic()
    results: list[CaseResult] = []
    done: dict[str, tuple[SmokeRequest, Exchange, CaseResult]] = {}
    for batch in batches(requests):
        if len(batch) == 1:
            exchanges = [send(server, batch[0])]
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                exchanges = list(pool.map(lambda r: send(server, r), batch))
        for request, exchange in zip(batch, exchanges, strict=True):
            result = judged(request, exchange, special_ids, vocab_size)
            reference = done.get(request.compare_to) if request.compare_to else None
            if reference is not None:
                try:
                    result = judge_consistency(
                        request,
                        result,
                        exchange,
                        reference[0],
                        reference[2],
                        reference[1],
                        special_ids=special_ids,
                        tie_tolerance=tie_tolerance,
                        logprob_tolerance=logprob_tolerance,
                    )
                except Exception as exc:  # as in `judged`: a result, never a traceback
                    result = _unjudged(request, exchange, exc)
            done[request.name] = (request, exchange, result)
            results.append(result)
            if on_case is not None:
                on_case(result)
    return summarise(results, time.monotonic() - started)
