"""The verdict from two measured sides, pure: `hold: broken` when the candidate fails on its own (a smoke
case, a known answer, the fix check, a probe it cannot answer), else `hold: drift` when its fingerprint parts
from the baseline's beyond the tolerance both sides measured, else `hold: slower` when a judged figure is
worse by more than the threshold, else `promote`. Every finding is reported, whichever decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from deploykit.gate.model import Drift, Figures, Reason, Side, SpeedFinding
from deploykit.profile.schema import KNOWN_ANSWER_PREFIX
from deploykit.smoke.fingerprint import Fingerprint, compare, tie_margin, top_gap
from deploykit.smoke.models import CaseResult

_KEY_PARTS_SHOWN = ("model", "weights", "dtype", "vllm", "device", "tensor_parallel_size", "fixes")


def changed_parts(baseline: Side, candidate: Side) -> dict[str, list[object]]:
    """The key parts that differ between the sides: what the upgrade changes."""
    return {
        part: [baseline.key_parts.get(part), candidate.key_parts.get(part)]
        for part in _KEY_PARTS_SHOWN
        if baseline.key_parts.get(part) != candidate.key_parts.get(part)
    }


def missed_known_answers(side: Side) -> list[CaseResult]:
    """The known answers (`smoke.known_answers`) the side got wrong: its answers differ from what is known,
    which is drift, never adoptable (docs/fingerprints.md, Upgrades)."""
    return [case for case in side.failed_cases if case.name.startswith(KNOWN_ANSWER_PREFIX)]


def broken_reason(side: Side) -> str | None:
    """Why a side fails on its own, whatever the other answers (a crash, NaN, token 0, an inconsistent or
    refused answer, a fix not active, a probe it cannot answer): None when it does not. A missed known answer
    is not broken: it is an answer that differs (`missed_known_answers`)."""
    if side.problem:
        return side.problem
    failed = [case for case in side.failed_cases if not case.name.startswith(KNOWN_ANSWER_PREFIX)]
    if failed:
        first = failed[0]
        more = f" (and {len(failed) - 1} more case(s))" if len(failed) > 1 else ""
        return f"case {first.name}: {first.diagnosis or 'failed'}{more}"
    if side.fingerprint is None:
        return "no fingerprint was taken"
    failed_load = [p for p in (side.figures.load if side.figures else []) if p.problem]
    if failed_load:
        return f"its load sample at {failed_load[0].streams} stream(s) failed: {failed_load[0].problem}"
    return None


def drift_between(baseline: Fingerprint, candidate: Fingerprint) -> tuple[Drift | None, float]:
    """Where the candidate first parts from the baseline, at the looser of the two sides' tolerances (each
    from its dtype and its own measured noise: a bfloat16 candidate is judged at bfloat16's); and that
    tolerance."""
    tolerance = max(baseline.tolerance, candidate.tolerance)
    mismatch, ties = compare(baseline.answers, candidate.answers, tolerance)
    if mismatch is None:
        return None, tolerance
    gap = mismatch.baseline_gap
    near = gap is None or gap < tie_margin(tolerance)
    return Drift(
        case=mismatch.prompt,
        position=mismatch.position,
        expected_id=mismatch.expected_id,
        got_id=mismatch.got_id,
        logprob_delta=mismatch.logprob_delta,
        token=mismatch.token,
        baseline_gap=gap,
        near_tie=near,
        tolerance=tolerance,
        near_ties_skipped=ties,
        text=mismatch.describe(tolerance),
    ), tolerance


def clear_positions(baseline: Fingerprint, tolerance: float) -> tuple[int, int]:
    """How many of the baseline's probe positions lead by a clear margin at `tolerance` (the ones whose ids
    must match), of how many: a comparison where none does compared nothing."""
    margin = tie_margin(tolerance)
    gaps = [top_gap(top) for answer in baseline.answers for top in answer.top]
    return sum(1 for gap in gaps if gap is not None and gap >= margin), len(gaps)


def speed_findings(baseline: Figures, candidate: Figures, threshold: float) -> list[SpeedFinding]:
    """Each figure both sides have: throughput and TPOT per stream count and KV-cache capacity are judged
    against `threshold`; start-up time is reported only (a warm compile cache halves it). A load figure is
    slower only when the candidate's best is worse than the baseline's best by more than the threshold AND
    worse than every baseline sample: on a machine whose own noise spans more than the threshold (a shared
    2-core host: the same server measured 0.46 to 2.0 × itself), the spread is the bound, as the fingerprint's
    tolerance is its measured noise."""
    findings: list[SpeedFinding] = []
    for point in baseline.load:
        other = candidate.at(point.streams)
        if other is None or point.problem or other.problem:
            continue  # a failed sample is the side's own finding (`broken_reason`), never "as fast"
        findings.append(
            _finding(
                "tokens_per_s",
                point.streams,
                point.tokens_per_s,
                other.tokens_per_s,
                True,
                threshold,
                point.tokens_per_s_worst,
            )
        )
        if point.tpot_ms is not None and other.tpot_ms is not None:
            findings.append(
                _finding(
                    "tpot_ms",
                    point.streams,
                    point.tpot_ms,
                    other.tpot_ms,
                    False,
                    threshold,
                    point.tpot_ms_worst,
                )
            )
    if baseline.kv_cache_tokens and candidate.kv_cache_tokens:
        findings.append(
            _finding(
                "kv_cache_tokens", None, baseline.kv_cache_tokens, candidate.kv_cache_tokens, True, threshold
            )
        )
    if baseline.startup_s and candidate.startup_s:
        finding = _finding("startup_s", None, baseline.startup_s, candidate.startup_s, False, threshold)
        findings.append(finding.model_copy(update={"judged": False, "slower": False}))
    return findings


def _finding(
    metric: str,
    streams: int | None,
    base: float,
    cand: float,
    higher_is_better: bool,
    threshold: float,
    base_worst: float | None = None,
) -> SpeedFinding:
    ratio = cand / base if base else float("inf")
    slower = ratio < 1 - threshold if higher_is_better else ratio > 1 + threshold
    if base_worst is not None:  # outside the baseline's own spread too
        slower = slower and (cand < base_worst if higher_is_better else cand > base_worst)
    return SpeedFinding(
        metric=metric,
        streams=streams,
        baseline=base,
        candidate=cand,
        baseline_worst=base_worst,
        ratio=round(ratio, 4),
        higher_is_better=higher_is_better,
        judged=True,
        slower=slower,
    )


def describe_finding(finding: SpeedFinding) -> str:
    at = f" at {finding.streams} stream(s)" if finding.streams is not None else ""
    ratio = f"× {finding.ratio:.2f}"
    return f"{finding.metric}{at}: {finding.candidate:g} vs the baseline's {finding.baseline:g} ({ratio})"


def verdict(
    baseline: Side,
    candidate: Side,
    drift: Drift | None,
    speed: Sequence[SpeedFinding],
    clear: tuple[int, int] | None = None,
) -> tuple[Reason | None, str]:
    """The deciding reason (None: promote) and the one line that says why. `clear`: the baseline's clear
    positions at the comparison's tolerance, of all (`clear_positions`): none clear is no evidence of
    agreement, so it holds as drift does, for a person to decide."""
    why = broken_reason(baseline)
    if why is not None:
        return "broken", f"the baseline fails on its own, so nothing can be compared: {why}"
    why = broken_reason(candidate)
    if why is not None:
        return "broken", f"the candidate fails on its own: {why}"
    missed = missed_known_answers(candidate)
    if missed:
        also = f"; the fingerprint too: {drift.text}" if drift is not None else ""
        more = f" (and {len(missed) - 1} more)" if len(missed) > 1 else ""
        return (
            "drift",
            f"the candidate misses a known answer: {missed[0].name}: {missed[0].diagnosis}{more}{also}",
        )
    if drift is not None:
        return "drift", f"the candidate's answers differ from the baseline's: {drift.text}"
    if clear is not None and clear[0] == 0:
        return "drift", (
            f"the fingerprints cannot be compared: all {clear[1]} of the baseline's positions are near ties "
            "at the looser side's tolerance, so nothing shows the answers agree (a person decides: --adopt "
            "--accept-drift)"
        )
    slower = [f for f in speed if f.judged and f.slower]
    if slower:
        return "slower", "the candidate is slower: " + "; ".join(describe_finding(f) for f in slower)
    return None, "the candidate answers as the baseline does" + (
        ", and is as fast" if any(f.judged for f in speed) else ""
    )


def drift_acceptable(reason: Reason | None, candidate: Side, speed: Sequence[SpeedFinding]) -> bool:
    """Whether a person may accept this hold (`--accept-drift`): it is drift of the fingerprint alone. Known
    answers must hold whoever accepts, and a slower or broken candidate is never adopted."""
    return (
        reason == "drift"
        and not missed_known_answers(candidate)
        and not any(f.judged and f.slower for f in speed)
    )


def why_not_acceptable(candidate: Side, speed: Sequence[SpeedFinding]) -> str:
    """What keeps a person's `--accept-drift` from adopting a drifted candidate, in one clause."""
    missed = missed_known_answers(candidate)
    if missed:
        return f"it misses a known answer ({missed[0].name}), which must hold whoever accepts"
    slower = [f for f in speed if f.judged and f.slower]
    if slower:
        return "it is also slower: " + "; ".join(describe_finding(f) for f in slower)
    return "it is not drift of the fingerprint alone"
