"""Fingerprint comparison (pure): near ties, tolerance by dtype, and what a mismatch says."""

from __future__ import annotations

import math

import pytest

from deploykit.smoke.fingerprint import (
    PROBE_PROMPTS,
    Fingerprint,
    ProbeAnswer,
    compare,
    count_near_ties,
    dtype_floor,
    logprob_tolerance,
    normalise_dtype,
    parse_answer,
    probe_body,
    reading_noise,
    tie_margin,
)

FP32 = logprob_tolerance("float32")


def answer(ids: list[int], gaps: list[float], prompt: str = "p", top1: float = -1.0) -> ProbeAnswer:
    """An answer whose chosen id leads the runner-up (id + 1000) by `gaps[n]` at position n."""
    return ProbeAnswer(
        prompt=prompt,
        ids=ids,
        top=[{i: top1, i + 1000: top1 - gap} for i, gap in zip(ids, gaps, strict=True)],
    )


def test_the_demo_models_small_margins_are_protected_in_float32() -> None:
    # The random tiny model's top-1/top-2 gaps are hundredths of a nat (0.0007 at the least, measured):
    # far above float32's tie margin, so every position counts.
    assert tie_margin(FP32) < 1e-4
    baseline = answer([5, 6, 7], [0.0007, 0.02, 0.03])
    drifted = answer([5, 9, 7], [0.0007, 0.02, 0.03])
    mismatch, ties = compare([baseline], [drifted], FP32)
    assert mismatch is not None and (mismatch.position, mismatch.expected_id, mismatch.got_id) == (1, 6, 9)
    assert ties == 0
    text = mismatch.describe(FP32)
    assert "expected id 6, got id 9" in text and "gap there is 0.02 nats" in text


def test_a_near_tie_in_the_baseline_is_never_a_mismatch_and_ends_that_answers_comparison() -> None:
    tolerance = logprob_tolerance("bfloat16")  # 0.25 nats: margin 0.5
    baseline = answer([5, 6, 7], [3.0, 0.1, 3.0])
    flipped = answer([5, 1006, 42], [3.0, 0.1, 3.0])  # the runner-up won at the near tie, then anything goes
    mismatch, ties = compare([baseline], [flipped], tolerance)
    assert mismatch is None and ties == 1
    # The same flip at a clear margin is a mismatch.
    assert compare([answer([5, 6, 7], [3.0, 0.6, 3.0])], [flipped], tolerance)[0] is not None


def test_logprobs_must_stay_within_the_tolerance_where_ids_agree() -> None:
    baseline = answer([5, 6], [0.02, 0.02], top1=-1.0)
    close = answer([5, 6], [0.02, 0.02], top1=-1.0 + 3e-6)
    moved = answer([5, 6], [0.02, 0.02], top1=-1.0 + 1e-3)
    assert compare([baseline], [close], FP32)[0] is None
    mismatch = compare([baseline], [moved], FP32)[0]
    assert mismatch is not None and mismatch.logprob_delta == pytest.approx(1e-3)
    assert "same id 5" in mismatch.describe(FP32)
    # bfloat16's tolerance allows what float32's does not.
    assert compare([baseline], [moved], logprob_tolerance("bfloat16"))[0] is None


def test_a_nan_logprob_is_a_mismatch() -> None:
    baseline = answer([5], [0.5])
    broken = ProbeAnswer(prompt="p", ids=[5], top=[{5: math.nan, 1005: -2.0}])
    assert compare([baseline], [broken], FP32)[0] is not None


def test_a_missing_answer_or_a_short_one_is_a_mismatch() -> None:
    baseline = answer([5, 6], [1.0, 1.0])
    assert compare([baseline], [], FP32)[0] is not None
    assert compare([baseline], [answer([5], [1.0])], FP32)[0] is not None


@pytest.mark.parametrize(
    ("dtype", "floor"),
    [("float32", 4 * 2**-24 * 16), ("float16", 4 * 2**-11 * 16), ("bfloat16", 4 * 2**-8 * 16)],
)
def test_the_tolerance_floor_follows_the_dtypes_unit_roundoff(dtype: str, floor: float) -> None:
    assert dtype_floor(dtype) == pytest.approx(floor)
    assert logprob_tolerance(dtype) == pytest.approx(floor)


def test_measured_noise_widens_the_tolerance_and_a_profile_override_wins() -> None:
    assert logprob_tolerance("float32", noise=1e-3) == pytest.approx(4e-3)
    assert logprob_tolerance("bfloat16", noise=1e-3) == pytest.approx(0.25)  # the floor is larger
    assert logprob_tolerance("bfloat16", noise=0.1, override=0.05) == 0.05
    assert logprob_tolerance("float32", noise=math.inf) == dtype_floor("float32")


def test_dtype_names_are_normalised_and_unknown_is_the_loosest() -> None:
    assert normalise_dtype("half") == "float16"
    assert normalise_dtype("float") == "float32"
    assert normalise_dtype("auto") == "bfloat16"
    assert normalise_dtype(None) == "bfloat16"


def test_reading_noise_counts_only_positions_where_ids_agree() -> None:
    first = [answer([5, 6, 7], [1.0, 1.0, 1.0], top1=-1.0)]
    second = [
        ProbeAnswer(prompt="p", ids=[5, 8, 7], top=[{5: -1.001, 1005: -2.0}, {8: -0.5, 1008: -9.0}, {7: 0.0}])
    ]
    assert reading_noise(first, second) == pytest.approx(0.001)


def test_near_ties_are_counted_against_the_margin() -> None:
    answers = [answer([5, 6, 7], [1e-6, 0.02, 1.0])]
    assert count_near_ties(answers, FP32) == 1
    assert count_near_ties(answers, logprob_tolerance("bfloat16")) == 2


def test_probe_bodies_are_greedy_fixed_length_with_top_k_ids() -> None:
    body = probe_body("tiny", PROBE_PROMPTS["ramp"], 5)
    assert body["temperature"] == 0 and body["ignore_eos"] and body["logprobs"] == 5
    assert body["return_tokens_as_token_ids"] and all(128 <= i < 256 for i in body["prompt"])


def test_an_answer_is_parsed_by_token_id_and_a_nan_makes_it_unusable() -> None:
    body = {
        "choices": [
            {"token_ids": [5, 6], "logprobs": {"top_logprobs": [{"token_id:5": -0.1}, {"token_id:6": -0.2}]}}
        ]
    }
    parsed = parse_answer("p", body)
    assert parsed is not None and parsed.top == [{5: -0.1}, {6: -0.2}]
    body["choices"][0]["logprobs"]["top_logprobs"][1] = {"token_id:6": math.nan}
    assert parse_answer("p", body) is None
    assert parse_answer("p", {"choices": []}) is None


@pytest.mark.parametrize(
    ("ids", "value"),
    [
        ([5.7, 6], -0.1),
        ([True, 6], -0.1),
        (["5", 6], -0.1),
        ([-1, 6], -0.1),
        ([10**30, 6], -0.1),
        ([5, 6], True),
    ],
)
def test_an_impossible_id_or_logprob_makes_a_probe_answer_unusable(ids: list[object], value: object) -> None:
    """Issue 31: `int()` read 5.7 as 5, True as 1 and "5" as 5; a boolean passed as a logprob."""
    body = {"choices": [{"token_ids": ids, "logprobs": {"top_logprobs": [{"token_id:5": value}]}}]}
    assert parse_answer("p", body) is None


def test_a_fingerprint_round_trips_through_json() -> None:
    fingerprint = Fingerprint(dtype="float32", answers=[answer([5], [0.5])], tolerance=FP32)
    again = Fingerprint.model_validate_json(fingerprint.model_dump_json())
    assert again == fingerprint and again.answers[0].top == [{5: -1.0, 1005: -1.5}]
