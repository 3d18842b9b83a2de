"""The smoke over HTTP: send each request (a consistency group's concurrent ones together), judge each
answer, compare each with the one it must equal. httpx is imported only when a request is sent."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from deploykit.smoke.consistency import DEFAULT_LOGPROB_TOLERANCE, DEFAULT_TIE_TOLERANCE, judge_consistency
from deploykit.smoke.judge import judge, summarise
from deploykit.smoke.models import CaseResult, Exchange, SmokeReport, SmokeRequest


def send(client: Any, request: SmokeRequest, timeout_s: float) -> Exchange:
    """POST one request; never raises for HTTP trouble, the Exchange says what happened."""
    import httpx

    started = time.monotonic()
    exchange = Exchange(timeout_s=timeout_s)
    try:
        response = client.post(request.endpoint, json=request.body, timeout=timeout_s)
    except httpx.TimeoutException:
        exchange.timed_out = True
    except httpx.HTTPError as exc:
        from deploykit.net import redact_text  # an exception's text can carry the URL or a header value

        exchange.transport_error = redact_text(f"{type(exc).__name__}: {exc}")
    else:
        exchange.status_code = response.status_code
        exchange.raw_text = response.text
        try:
            exchange.body = json.loads(response.text)  # json accepts NaN/Infinity, which the rules want
        except ValueError:
            exchange.body = None
    exchange.latency_s = time.monotonic() - started
    return exchange


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
    base_url: str,
    requests: Sequence[SmokeRequest],
    *,
    timeout_s: float,
    api_key: str | None = None,
    special_ids: frozenset[int] = frozenset(),
    on_case: Callable[[CaseResult], None] | None = None,
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> SmokeReport:
    """Send each request in order and judge it; `on_case(result)` is called after each."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    started = time.monotonic()
    results: list[CaseResult] = []
    done: dict[str, tuple[SmokeRequest, Exchange, CaseResult]] = {}
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as client:
        for batch in batches(requests):
            if len(batch) == 1:
                exchanges = [send(client, batch[0], timeout_s)]
            else:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=len(batch)) as pool:
                    exchanges = list(pool.map(lambda r: send(client, r, timeout_s), batch))
            for request, exchange in zip(batch, exchanges, strict=True):
                result = judge(request, exchange, special_ids)
                reference = done.get(request.compare_to) if request.compare_to else None
                if reference is not None:
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
                done[request.name] = (request, exchange, result)
                results.append(result)
                if on_case is not None:
                    on_case(result)
    return summarise(results, time.monotonic() - started)
