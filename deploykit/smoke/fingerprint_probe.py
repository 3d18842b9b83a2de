"""Take a fingerprint over HTTP: send the probe set and read the answers. Two readings (each probe alone,
then all at once, so the batch shape differs) measure the run-to-run noise the tolerance is built on; the
canary takes one reading per run and uses the baseline's noise."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from deploykit.endpoint import Endpoint
from deploykit.smoke.client import Server, send
from deploykit.smoke.fingerprint import (
    PROBE_PROMPTS,
    Fingerprint,
    ProbeAnswer,
    count_near_ties,
    logprob_tolerance,
    normalise_dtype,
    probe_body,
    reading_noise,
)
from deploykit.smoke.models import Exchange, SmokeRequest

__all__ = ["ProbeFailed", "ProbeUnstable", "take_fingerprint"]


class ProbeFailed(Exception):
    """A probe got no usable answer: `miss` when it got none at all (timeout, transport, HTTP 5xx/429),
    else the answer was wrong (no ids, a NaN logprob)."""

    def __init__(self, message: str, miss: bool) -> None:
        super().__init__(message)
        self.miss = miss


class ProbeUnstable(Exception):
    """The two readings disagree at a clear margin: the deployment does not answer itself consistently."""


def _requests(served_name: str, top_k: int) -> list[SmokeRequest]:
    return [
        SmokeRequest(
            f"fingerprint:{name}", "fingerprint", "/v1/completions", probe_body(served_name, ids, top_k)
        )
        for name, ids in PROBE_PROMPTS.items()
    ]


def _answers(requests: Sequence[SmokeRequest], exchanges: Sequence[Exchange]) -> list[ProbeAnswer]:
    from deploykit.smoke.fingerprint import parse_answer
    from deploykit.smoke.judge import http_problem

    answers = []
    for request, exchange in zip(requests, exchanges, strict=True):
        answer = (
            parse_answer(request.name.split(":", 1)[1], exchange.body)
            if exchange.status_code == 200
            else None
        )
        if answer is None:
            why = exchange.transport_error or ("timeout" if exchange.timed_out else http_problem(exchange))
            busy = exchange.status_code is None or exchange.status_code >= 500 or exchange.status_code == 429
            if exchange.too_big is not None:
                why, busy = exchange.too_big, False
            elif exchange.status_code == 200:
                why = "no token ids, or a logprob that is NaN or infinite"
            raise ProbeFailed(f"{request.name}: no usable answer ({why})", miss=busy)
        answers.append(answer)
    return answers


def take_fingerprint(
    endpoint: Endpoint,
    served_name: str,
    *,
    dtype: str | None,
    top_k: int,
    readings: int = 2,
    tolerance_override: float | None = None,
) -> Fingerprint:
    """The probe set's answers (`readings` 2: alone, then together; 1: together), each probe within the
    endpoint's request deadline. Raises ProbeFailed."""
    requests = _requests(served_name, top_k)
    server = Server(endpoint)
    together_readings: list[list[ProbeAnswer]] = []
    if readings >= 2:
        together_readings.append(_answers(requests, [send(server, r) for r in requests]))
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        exchanges = list(pool.map(lambda r: send(server, r), requests))
    together_readings.append(_answers(requests, exchanges))
    first = together_readings[0]
    noise = reading_noise(first, together_readings[-1]) if len(together_readings) > 1 else 0.0
    name = normalise_dtype(dtype)
    tolerance = logprob_tolerance(name, noise, tolerance_override)
    if len(together_readings) > 1:
        from deploykit.smoke.fingerprint import compare

        mismatch, _ = compare(first, together_readings[-1], tolerance)
        if mismatch is not None:
            raise ProbeUnstable(
                "the probe set read alone and read as one batch disagree: " + mismatch.describe(tolerance)
            )
    return Fingerprint(
        top_k=top_k,
        dtype=name,
        answers=first,
        noise=noise,
        tolerance=tolerance,
        near_ties=count_near_ties(first, tolerance),
    )
