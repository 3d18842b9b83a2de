"""Sides and fingerprints as the gate measures them, built by hand for the pure tests."""

from __future__ import annotations

from deploykit.gate.model import Figures, LoadPoint, Side
from deploykit.smoke.fingerprint import Fingerprint, ProbeAnswer, logprob_tolerance
from deploykit.smoke.models import CaseResult

PARTS = {
    "model": "builtin:tiny-llama",
    "weights": "sha256:0",
    "dtype": "float32",
    "vllm": "0.32.0+cpu",
    "device": "cpu: test",
    "tensor_parallel_size": 1,
    "fixes": [],
    "probe_set": 1,
    "top_k": 5,
}


def answer(ids: list[int], gaps: list[float], prompt: str = "pattern1") -> ProbeAnswer:
    """The chosen id leads the runner-up (id + 1000) by `gaps[n]` at position n."""
    return ProbeAnswer(
        prompt=prompt, ids=ids, top=[{i: -1.0, i + 1000: -1.0 - g} for i, g in zip(ids, gaps, strict=True)]
    )


def fingerprint(ids: list[int], gaps: list[float], dtype: str = "float32", noise: float = 0.0) -> Fingerprint:
    return Fingerprint(
        dtype=dtype, answers=[answer(ids, gaps)], noise=noise, tolerance=logprob_tolerance(dtype, noise)
    )


def point(streams: int, tokens_per_s: float, tpot_ms: float | None = 5.0, problem: str = "") -> LoadPoint:
    return LoadPoint(
        streams=streams,
        requests=streams * 2,
        output_tokens=int(tokens_per_s),
        wall_s=1.0,
        tokens_per_s=tokens_per_s,
        tpot_ms=tpot_ms,
        problem=problem,
    )


def side(
    role: str = "candidate",
    *,
    fp: Fingerprint | None = None,
    load: list[LoadPoint] | None = None,
    kv: int | None = 65536,
    cases: list[CaseResult] | None = None,
    problem: str = "",
    **parts: object,
) -> Side:
    return Side(
        role=role,  # type: ignore[arg-type]
        source="url",
        key_parts={**PARTS, **parts},
        cases=cases if cases is not None else [case("completion", passed=True)],
        fingerprint=fp if fp is not None else fingerprint([5, 6, 7], [0.02, 0.03, 0.04]),
        figures=Figures(
            load=load if load is not None else [point(1, 300), point(4, 900)], kv_cache_tokens=kv
        ),
        problem=problem,
    )


def case(name: str, *, passed: bool, diagnosis: str = "") -> CaseResult:
    return CaseResult(
        name=name,
        kind="completion",
        endpoint="/v1/completions",
        model="tiny",
        passed=passed,
        diagnosis=diagnosis,
    )
