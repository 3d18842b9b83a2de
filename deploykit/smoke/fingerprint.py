"""Fingerprints: what a deployment answers to a fixed, versioned probe set under greedy decoding, and how two
fingerprints of one key are compared. Pure: no server, no store (`fingerprint_probe` asks the server,
`deploykit.fleet_baseline` finds the baseline to compare with).

Consistency checks catch an answer that changes; a GPU that is consistently wrong (silent data corruption, a
bad kernel) answers every repeat the same way. Only a comparison with what a healthy deployment of the same
key answered catches it. How the tolerances are derived: docs/fingerprints.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PROBE_SET_VERSION = 1
"""Bump when a prompt, `PROBE_MAX_TOKENS` or the request shape changes: it is part of every baseline key."""
PROBE_MAX_TOKENS = 8
DEFAULT_TOP_K = 5

# Token-id prompts, so a probe is the same request whatever the tokenizer (ids 128..255 are ordinary tokens
# in every vocabulary deploykit serves; see deploykit.smoke.cases). Each repeats a short pattern: a trained
# model continues a repeated pattern with a large top-1/top-2 margin (induction), so its probes are far from
# near ties; a model with flat logits (the demo's random one) still gets every position compared, because the
# near-tie margin comes from the dtype, not from a fixed number of nats.
PROBE_PROMPTS: dict[str, list[int]] = {
    "pattern4": [131, 172, 205, 149] * 4,
    "pattern3": [188, 141, 233] * 5,
    "pattern5": [162, 199, 137, 250, 176] * 3,
    "ramp": [128 + (n * 11) % 128 for n in range(16)],
}

# Unit roundoff (half the machine epsilon) of each compute dtype: the relative error of one rounding.
UNIT_ROUNDOFF: dict[str, float] = {
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
LOGIT_SCALE = 16.0
"""Magnitude of the logits a rounding acts on (nats); real models' top logits are in the tens."""
ROUNDINGS = 4
"""Roundings a logprob may differ by between two readings: the logit and the log-sum-exp, in each reading."""
NOISE_FACTOR = 4.0
"""The tolerance is at least this many times the run-to-run noise measured when the fingerprint was taken."""

DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
}


def normalise_dtype(dtype: str | None) -> str:
    """A dtype as the tolerance table names it; unknown (or `auto` unresolved) is bfloat16, the loosest."""
    name = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower()) if dtype else "bfloat16"
    return name if name in UNIT_ROUNDOFF else "bfloat16"


def dtype_floor(dtype: str) -> float:
    """The smallest logprob difference two correct readings in `dtype` may show: ROUNDINGS × u × LOGIT_SCALE
    (float32 3.8e-6, float16 0.031, bfloat16 0.25 nats)."""
    return ROUNDINGS * UNIT_ROUNDOFF[normalise_dtype(dtype)] * LOGIT_SCALE


def logprob_tolerance(dtype: str, noise: float = 0.0, override: float | None = None) -> float:
    """How far a logprob may move between two healthy readings: the dtype's floor, or NOISE_FACTOR × the
    measured noise when that is larger; a profile's explicit `override` wins."""
    if override is not None:
        return override
    measured = noise if math.isfinite(noise) else 0.0
    return max(dtype_floor(dtype), NOISE_FACTOR * measured)


def tie_margin(tolerance: float) -> float:
    """A top-1/top-2 gap below this is a near tie: each of the two logprobs may move by `tolerance` in
    opposite directions, so only a gap under twice the tolerance can flip the greedy choice."""
    return 2.0 * tolerance


class ProbeAnswer(BaseModel):
    """One probe prompt's greedy answer: the ids, and per position the top-k logprobs by token id."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    ids: list[int]
    top: list[dict[int, float]] = Field(default_factory=list)


Verdict = Literal["new", "match", "mismatch", "disputed", "decides", "unchecked"]
"""new: no baseline yet (a passing run becomes it); match; mismatch: a confirmed baseline disagrees
(corruption); disputed: a provisional baseline from another host disagrees (nobody is picked);
decides: agrees with a disputed candidate from another host (that candidate becomes the baseline);
unchecked: no fingerprint could be compared."""


class Comparison(BaseModel):
    """What the comparison with the key's baseline found, and which baseline it was."""

    model_config = ConfigDict(extra="forbid")

    verdict: Verdict
    diagnosis: str = ""
    baseline_id: int | None = None
    baseline_row: int | None = None
    baseline_host: str | None = None
    baseline_at: str | None = None
    baseline_confirmed: bool = False
    agrees_with_row: int | None = Field(
        default=None,
        description="the disputed candidate's row it agrees with (the third decides)",
    )


class Fingerprint(BaseModel):
    """A deployment's answers to the probe set, with the key that says which answers must be identical."""

    model_config = ConfigDict(extra="forbid")

    probe_set: int = PROBE_SET_VERSION
    top_k: int = DEFAULT_TOP_K
    dtype: str
    key: str = ""
    key_parts: dict[str, Any] = Field(default_factory=dict)
    answers: list[ProbeAnswer]
    noise: float = Field(default=0.0, description="largest logprob difference between two readings (nats)")
    tolerance: float = 0.0
    near_ties: int = Field(default=0, description="positions whose top-1/top-2 gap is below the tie margin")
    comparison: Comparison | None = None


class Mismatch(BaseModel):
    """Where a fingerprint first parts from its baseline."""

    prompt: str
    position: int
    expected_id: int
    got_id: int | None
    baseline_gap: float | None = Field(description="the baseline's top-1/top-2 gap at that position")
    logprob_delta: float | None = Field(
        default=None, description="how far the logprob of a token in both top-k moved (same ids)"
    )
    token: int | None = None

    def describe(self, tolerance: float) -> str:
        where = f"probe {self.prompt!r} at generated position {self.position}"
        if self.logprob_delta is not None:
            return (
                f"{where}: same id {self.expected_id}, but the logprob of token {self.token} moved by "
                f"{_fmt(self.logprob_delta)} nats (tolerance {_fmt(tolerance)})"
            )
        got = "no token" if self.got_id is None else f"id {self.got_id}"
        return (
            f"{where}: expected id {self.expected_id}, got {got}; the baseline's top-1/top-2 logprob gap "
            f"there is {_fmt(self.baseline_gap)} nats, above the near-tie margin "
            f"{_fmt(tie_margin(tolerance))}"
        )


def _fmt(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3g}"


def top_gap(top: dict[int, float]) -> float | None:
    values = sorted(top.values(), reverse=True)
    return values[0] - values[1] if len(values) >= 2 else None


def count_near_ties(answers: Sequence[ProbeAnswer], tolerance: float) -> int:
    margin = tie_margin(tolerance)
    return sum(1 for answer in answers for top in answer.top if (gap := top_gap(top)) is None or gap < margin)


def compare(
    baseline: Sequence[ProbeAnswer], got: Sequence[ProbeAnswer], tolerance: float
) -> tuple[Mismatch | None, int]:
    """The first mismatch of `got` against `baseline` (None when they agree) and how many near ties were
    skipped. Ids must match wherever the baseline's top-1/top-2 gap is at least the tie margin; once ids
    part at a near tie the rest of that answer is not comparable (it continues another prefix). Where ids
    match, every token in both top-k lists must keep its logprob within `tolerance`."""
    margin = tie_margin(tolerance)
    mine = {answer.prompt: answer for answer in got}
    ties = 0
    for reference in baseline:
        answer = mine.get(reference.prompt)
        if answer is None:
            return Mismatch(
                prompt=reference.prompt,
                position=0,
                expected_id=reference.ids[0] if reference.ids else -1,
                got_id=None,
                baseline_gap=None,
            ), ties
        for position, expected in enumerate(reference.ids):
            top = reference.top[position] if position < len(reference.top) else {}
            gap = top_gap(top)
            near = gap is None or gap < margin
            got_id = answer.ids[position] if position < len(answer.ids) else None
            if got_id != expected:
                if near and got_id is not None:
                    ties += 1
                    break
                return Mismatch(
                    prompt=reference.prompt,
                    position=position,
                    expected_id=expected,
                    got_id=got_id,
                    baseline_gap=gap,
                ), ties
            if near:
                ties += 1
            other = answer.top[position] if position < len(answer.top) else {}
            for token, value in top.items():
                if token not in other:
                    continue
                delta = abs(value - other[token])
                if not delta <= tolerance:  # NaN included
                    return Mismatch(
                        prompt=reference.prompt,
                        position=position,
                        expected_id=expected,
                        got_id=got_id,
                        baseline_gap=gap,
                        logprob_delta=delta,
                        token=token,
                    ), ties
    return None, ties


def reading_noise(first: Sequence[ProbeAnswer], second: Sequence[ProbeAnswer]) -> float:
    """The largest logprob difference between two readings, over the positions where their ids agree."""
    noise = 0.0
    others = {answer.prompt: answer for answer in second}
    for answer in first:
        other = others.get(answer.prompt)
        if other is None:
            continue
        for position, (a, b) in enumerate(zip(answer.ids, other.ids, strict=False)):
            if a != b or position >= len(answer.top) or position >= len(other.top):
                break
            for token, value in answer.top[position].items():
                if token in other.top[position]:
                    noise = max(noise, abs(value - other.top[position][token]))
    return noise


def probe_body(model: str, prompt: list[int], top_k: int) -> dict[str, Any]:
    """Greedy, a fixed length (`ignore_eos`), the top-k logprobs keyed by token id."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": PROBE_MAX_TOKENS,
        "temperature": 0,
        "logprobs": top_k,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
    }


def parse_answer(prompt: str, body: Any) -> ProbeAnswer | None:
    """A probe's answer from a /v1/completions body; None when it has no ids or a logprob is not finite."""
    try:
        choice = body["choices"][0]
        ids = choice["token_ids"]
        if not isinstance(ids, list) or not all(type(i) is int and 0 <= i < 2**31 for i in ids):
            return None  # a bool, float, string or impossible id is no token id
        entries = (choice.get("logprobs") or {}).get("top_logprobs") or []
        top: list[dict[int, float]] = []
        for entry in entries:
            row: dict[int, float] = {}
            for key, value in (entry or {}).items():
                _, sep, number = str(key).rpartition("token_id:")
                number_like = isinstance(value, int | float) and not isinstance(value, bool)
                if not sep or not number_like or not math.isfinite(value):
                    return None
                row[int(number)] = float(value)
            top.append(row)
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return ProbeAnswer(prompt=prompt, ids=ids, top=top)
