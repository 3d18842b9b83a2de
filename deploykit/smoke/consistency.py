"""Consistency: do two answers to the same greedy request agree? `compare_traces()` finds the first
differing position and says whether it is a near tie (a warning: vLLM does not promise bit-identical
results across batch shapes) or a real divergence; `judge_consistency()` turns that into the verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deploykit.smoke.models import CaseResult, Exchange, SmokeRequest

DEFAULT_TIE_TOLERANCE = 0.05
DEFAULT_LOGPROB_TOLERANCE = 0.05


@dataclass(frozen=True)
class Trace:
    """A completion's generated ids with, per position, the chosen token's logprob and the top ids."""

    ids: list[int]
    chosen: list[float | None]
    top: list[dict[int, float]]


def parse_trace(body: Any) -> Trace | None:
    """Read a /v1/completions answer made with `return_tokens_as_token_ids`; None when it has no ids."""
    try:
        choice = body["choices"][0]
        ids = [int(i) for i in choice["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    logprobs = choice.get("logprobs") or {}
    chosen = list(logprobs.get("token_logprobs") or [])
    top: list[dict[int, float]] = []
    for entry in logprobs.get("top_logprobs") or []:
        row: dict[int, float] = {}
        for key, value in (entry or {}).items():
            token = _token_id(key)
            if token is not None and isinstance(value, (int, float)):
                row[token] = float(value)
        top.append(row)
    return Trace(ids=ids, chosen=chosen, top=top)


def _token_id(key: str) -> int | None:
    _, sep, number = str(key).rpartition("token_id:")
    try:
        return int(number) if sep else None
    except ValueError:
        return None


def top2_gap(trace: Trace, position: int) -> float | None:
    """How far the best token led the second best at `position`; None when it is not known."""
    if position >= len(trace.top):
        return None
    values = sorted((v for v in trace.top[position].values() if math.isfinite(v)), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


@dataclass(frozen=True)
class Divergence:
    """Where two answers part. `position` None: same ids, but the logprobs moved past the tolerance."""

    position: int | None
    reference_ids: list[int]
    ids: list[int]
    reference_gap: float | None = None
    gap: float | None = None
    near_tie: bool = False
    logprob_delta: float | None = None
    logprob_position: int | None = None
    bad_token: int | None = None

    def describe(self, what: str, reference: str, tie_tolerance: float) -> str:
        if self.position is None:
            return (
                f"{what}: same ids as {reference}, but a chosen token's logprob moved by "
                f"{_fmt(self.logprob_delta)} at generated position {self.logprob_position}"
            )
        gaps = f"{_fmt(self.reference_gap)} ({reference}) vs {_fmt(self.gap)} (this one)"
        text = (
            f"{what}: differs from {reference} at generated position {self.position}: ids "
            f"{_around(self.reference_ids, self.position)} vs {_around(self.ids, self.position)}; "
            f"top-2 logprob gap there {gaps}"
        )
        if self.bad_token is not None:
            return text + f"; the diverging id {self.bad_token} is 0 or a special/pad token"
        if self.near_tie:
            return text + (
                f", below the near-tie tolerance {tie_tolerance:g}: a near tie (vLLM does not promise "
                "bit-identical results across batch shapes)"
            )
        return text + f", a clear margin (near-tie tolerance {tie_tolerance:g}): the answer really changed"


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4g}"


def _around(ids: Sequence[int], position: int, width: int = 2) -> str:
    start = max(0, position - width)
    parts = [
        f">{i}<" if start + n == position else str(i) for n, i in enumerate(ids[start : position + width + 1])
    ]
    if position >= len(ids):
        parts.append(">end<")
    return (
        ("[…, " if start else "[") + ", ".join(parts) + (", …]" if position + width + 1 < len(ids) else "]")
    )


def compare_traces(
    reference: Trace,
    other: Trace,
    *,
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float | None = None,
    special_ids: frozenset[int] = frozenset(),
) -> Divergence | None:
    """None when the answers agree; else where they part, and whether it is only a near tie."""
    position = next(
        (n for n, (a, b) in enumerate(zip(reference.ids, other.ids, strict=False)) if a != b),
        None if len(reference.ids) == len(other.ids) else min(len(reference.ids), len(other.ids)),
    )
    if position is not None:
        gap_a, gap_b = top2_gap(reference, position), top2_gap(other, position)
        chosen = [seq[position] for seq in (reference.ids, other.ids) if position < len(seq)]
        bad = next((i for i in chosen if i == 0 or i in special_ids), None)
        near = (
            bad is None
            and len(chosen) == 2
            and gap_a is not None
            and gap_b is not None
            and max(gap_a, gap_b) < tie_tolerance
        )
        return Divergence(position, reference.ids, other.ids, gap_a, gap_b, near, bad_token=bad)
    if logprob_tolerance is not None:
        for n, (a, b) in enumerate(zip(reference.chosen, other.chosen, strict=False)):
            if a is None or b is None:
                continue
            delta = abs(a - b)
            if not math.isfinite(delta) or delta > logprob_tolerance:
                return Divergence(None, reference.ids, other.ids, logprob_delta=delta, logprob_position=n)
    return None


_WHAT = {
    "repeat": "the same greedy request again",
    "long_then_short": "the short prompt again after the long one",
    "prefix_cache": "the same long prompt again (a prefix-cache hit)",
    "batch": "identical requests sent at once",
}


def judge_consistency(
    request: SmokeRequest,
    result: CaseResult,
    exchange: Exchange,
    reference: SmokeRequest,
    reference_result: CaseResult,
    reference_exchange: Exchange,
    *,
    special_ids: frozenset[int] = frozenset(),
    tie_tolerance: float = DEFAULT_TIE_TOLERANCE,
    logprob_tolerance: float = DEFAULT_LOGPROB_TOLERANCE,
) -> CaseResult:
    """Compare an answer that passed on its own with the one it must equal; fail or warn on a divergence."""
    if not result.passed:
        if reference_result.passed and not result.miss:
            result.diagnosis += (
                f" ({_WHAT.get(request.kind, request.kind)}: {reference.name} had a good answer before)"
            )
        return result
    if not reference_result.passed:
        result.warning = f"not compared: {reference.name} failed"
        return result
    mine, theirs = parse_trace(exchange.body), parse_trace(reference_exchange.body)
    if mine is None or theirs is None:
        result.warning = "not compared: an answer has no token ids"
        return result
    divergence = compare_traces(
        theirs,
        mine,
        tie_tolerance=tie_tolerance,
        logprob_tolerance=logprob_tolerance if request.check_logprobs else None,
        special_ids=special_ids,
    )
    if divergence is None:
        return result
    what = _WHAT.get(request.kind, request.kind)
    if divergence.position is None:
        result.passed = False
        result.diagnosis = (
            f"{what}: same ids as {reference.name}, but a chosen token's logprob moved by "
            f"{_fmt(divergence.logprob_delta)} at generated position {divergence.logprob_position} "
            f"(tolerance {logprob_tolerance:g})"
        )
    elif divergence.near_tie:
        result.warning = divergence.describe(what, reference.name, tie_tolerance)
    else:
        result.passed = False
        result.diagnosis = divergence.describe(what, reference.name, tie_tolerance)
    return result
