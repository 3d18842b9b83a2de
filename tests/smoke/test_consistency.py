"""Consistency cases: how their requests are built, and how two answers to one greedy request are judged.

The answers copy the shape vLLM 0.32 returns for `/v1/completions` with `logprobs: 2` and
`return_tokens_as_token_ids: true` (keys of `top_logprobs` are `token_id:N`).
"""

from __future__ import annotations

from typing import Any

import pytest

from deploykit.profile.load import load_profile
from deploykit.profile.schema import Profile, SmokeCase
from deploykit.smoke import (
    LONG_PROMPT_TOKENS,
    CaseResult,
    Exchange,
    SmokeRequest,
    batches,
    compare_traces,
    derive_cases,
    judge,
    judge_consistency,
    long_prompt_ids,
    long_prompt_tokens,
    parse_trace,
    smoke_requests,
    summarise,
    top2_gap,
)


def answer(
    ids: list[int], gaps: list[float] | None = None, chosen: list[float] | None = None
) -> dict[str, Any]:
    """A completions answer whose top-2 at each position is the chosen id and id 999 `gap` below it."""
    gaps = gaps or [2.0] * len(ids)
    chosen = chosen or [-0.5] * len(ids)
    top = [
        {f"token_id:{i}": lp, f"token_id:{999 if i != 999 else 998}": lp - gap}
        for i, lp, gap in zip(ids, chosen, gaps, strict=True)
    ]
    return {
        "choices": [
            {
                "text": " words",
                "token_ids": ids,
                "finish_reason": "length",
                "logprobs": {
                    "tokens": [f"token_id:{i}" for i in ids],
                    "token_logprobs": chosen,
                    "top_logprobs": top,
                },
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": len(ids)},
    }


def _profile(**overrides: Any) -> Profile:
    data: dict[str, Any] = {"name": "p", "model": {"source": "/models/m"}}
    data.update(overrides)
    return Profile.model_validate(data)


# --- which requests ---------------------------------------------------------------------------------


def test_every_profile_gets_repeat_and_long_then_short_sized_to_its_max_model_len() -> None:
    demo = derive_cases(load_profile("demo-cpu").profile)
    assert [c.kind for c in demo] == ["completion", "chat", "repeat", "long_then_short"]
    assert demo[3].prompt_tokens == LONG_PROMPT_TOKENS  # max_model_len 1024 has room for 512
    small = derive_cases(_profile(serve={"max_model_len": 256}))
    assert small[-1].kind == "long_then_short" and small[-1].prompt_tokens == 256 - 16 - 1
    unknown = derive_cases(_profile())
    assert unknown[-1].prompt_tokens == LONG_PROMPT_TOKENS
    explicit = derive_cases(
        _profile(serve={"max_model_len": 300}, smoke={"cases": [{"kind": "prefix_cache"}]})
    )
    assert explicit[0].prompt_tokens == 300 - 16 - 1


@pytest.mark.parametrize(
    "name",
    ["demo-cpu", "demo-gemma4-fp16", "gemma4-turing", "penalties-high-concurrency", "qwen-lora-hopper"],
)
def test_every_shipped_profile_checks_consistency(name: str) -> None:
    profile = load_profile(name).profile
    kinds = [c.kind for c in derive_cases(profile)]
    assert "repeat" in kinds and "long_then_short" in kinds
    for case in derive_cases(profile):
        if case.kind == "long_then_short":
            assert case.prompt_tokens is not None
            limit = profile.serve.max_model_len
            assert limit is None or case.prompt_tokens + case.max_tokens < limit


def test_long_prompt_length_rule() -> None:
    assert long_prompt_tokens(None, 16) == 512
    assert long_prompt_tokens(4096, 16) == 512
    assert long_prompt_tokens(256, 16) == 239
    assert len(long_prompt_ids(512)) == 512
    assert all(128 <= i < 256 for i in long_prompt_ids(512, salt=7))
    assert long_prompt_ids(20, salt=1)[0] != long_prompt_ids(20, salt=2)[0]  # no shared cache block
    assert long_prompt_ids(20, salt=3) == long_prompt_ids(20, salt=3)


def test_consistency_requests_are_groups_with_a_reference() -> None:
    cases = [
        SmokeCase(kind="repeat"),
        SmokeCase(kind="long_then_short", prompt_tokens=520),
        SmokeCase(kind="prefix_cache", prompt_tokens=600),
        SmokeCase(kind="batch", batch_size=3),
        SmokeCase(kind="repeat"),
    ]
    requests = smoke_requests(cases, "tiny", salt=10)
    by_name = {r.name: r for r in requests}
    assert [r.name for r in requests] == [
        "repeat:1",
        "repeat:2",
        "long_then_short:short",
        "long_then_short:long",
        "long_then_short:again",
        "prefix_cache:1",
        "prefix_cache:2",
        "batch:1",
        "batch:2",
        "batch:3",
        "repeat:1#2",
        "repeat:2#2",
    ]
    assert by_name["repeat:2"].compare_to == "repeat:1"
    assert by_name["repeat:2#2"].compare_to == "repeat:1#2"
    assert by_name["repeat:1"].group != by_name["repeat:1#2"].group
    assert by_name["long_then_short:again"].compare_to == "long_then_short:short"
    assert by_name["long_then_short:again"].body == by_name["long_then_short:short"].body
    long = by_name["long_then_short:long"]
    assert len(long.body["prompt"]) == 520 and long.min_prompt_tokens == 519
    assert by_name["prefix_cache:1"].body == by_name["prefix_cache:2"].body
    assert by_name["prefix_cache:2"].check_logprobs and not by_name["repeat:2"].check_logprobs
    assert by_name["prefix_cache:1"].body["prompt"][0] != long.body["prompt"][0]  # own cache blocks
    for request in requests:
        assert request.endpoint == "/v1/completions"
        assert request.body["temperature"] == 0 and request.body["return_token_ids"] is True
        assert request.body["logprobs"] == 2 and request.body["return_tokens_as_token_ids"] is True
        assert request.body["ignore_eos"] is True  # same length every time; EOS first is no failure
    assert [len(b) for b in batches(requests)] == [1, 1, 1, 1, 1, 1, 1, 3, 1, 1]
    assert {r.compare_to for r in requests if r.kind == "batch"} == {None, "batch:1"}


def test_salt_changes_only_the_long_prompts() -> None:
    cases = [SmokeCase(kind="long_then_short", prompt_tokens=40)]
    one, two = smoke_requests(cases, "m", salt=1), smoke_requests(cases, "m", salt=2)
    assert one[0].body == two[0].body
    assert one[1].body["prompt"] != two[1].body["prompt"]


# --- judging divergence -----------------------------------------------------------------------------


def test_identical_answers_agree() -> None:
    a = parse_trace(answer([5, 6, 7]))
    assert a is not None and a.ids == [5, 6, 7] and a.top[0] == {5: -0.5, 999: -2.5}
    assert top2_gap(a, 1) == pytest.approx(2.0)
    assert compare_traces(a, a) is None


def test_divergence_at_a_clear_margin_names_position_ids_and_gap() -> None:
    ref = parse_trace(answer([5, 6, 7, 8, 9]))
    other = parse_trace(answer([5, 6, 70, 80, 90], gaps=[2.0, 2.0, 1.5, 2.0, 2.0]))
    assert ref is not None and other is not None
    divergence = compare_traces(ref, other, tie_tolerance=0.05)
    assert divergence is not None and divergence.position == 2 and not divergence.near_tie
    assert divergence.reference_gap == pytest.approx(2.0) and divergence.gap == pytest.approx(1.5)
    text = divergence.describe("the same greedy request again", "repeat:1", 0.05)
    assert "at generated position 2" in text
    assert "[5, 6, >7<, 8, 9]" in text and "[5, 6, >70<, 80, 90]" in text
    assert "top-2 logprob gap there 2 (repeat:1) vs 1.5" in text and "clear margin" in text


def test_divergence_at_a_near_tie_is_a_warning_not_a_failure() -> None:
    request = SmokeRequest("batch:2", "batch", "/v1/completions", {"model": "m"}, compare_to="batch:1")
    reference = SmokeRequest("batch:1", "batch", "/v1/completions", {"model": "m"})
    ref_body = answer([5, 6, 7], gaps=[2.0, 0.001, 2.0])
    other_body = answer([5, 60, 7], gaps=[2.0, 0.002, 2.0])
    ref_ex, other_ex = Exchange(200, ref_body), Exchange(200, other_body)
    ref_result, result = judge(reference, ref_ex), judge(request, other_ex)
    judged = judge_consistency(request, result, other_ex, reference, ref_result, ref_ex, tie_tolerance=0.05)
    assert judged.passed and "near tie" in judged.warning and "position 1" in judged.warning
    report = summarise([ref_result, judged])
    assert report.passed and "warnings: batch:2:" in report.diagnosis
    strict = judge_consistency(
        request, judge(request, other_ex), other_ex, reference, ref_result, ref_ex, tie_tolerance=0.0001
    )
    assert not strict.passed and "clear margin" in strict.diagnosis


def test_a_near_tie_onto_token_0_or_a_special_still_fails() -> None:
    ref = parse_trace(answer([5, 6, 7], gaps=[2.0, 0.001, 2.0]))
    other = parse_trace(answer([5, 0, 0], gaps=[2.0, 0.001, 0.001]))
    assert ref is not None and other is not None
    divergence = compare_traces(ref, other, tie_tolerance=0.05)
    assert divergence is not None and not divergence.near_tie and divergence.bad_token == 0
    special = parse_trace(answer([5, 2, 7], gaps=[2.0, 0.001, 2.0]))
    assert special is not None
    divergence = compare_traces(ref, special, tie_tolerance=0.05, special_ids=frozenset({2}))
    assert divergence is not None and divergence.bad_token == 2
    assert "0 or a special/pad token" in divergence.describe("x", "y", 0.05)


def test_unknown_gaps_and_different_lengths_are_real_divergences() -> None:
    ref = parse_trace(answer([5, 6, 7]))
    shorter = parse_trace(answer([5, 6]))
    assert ref is not None and shorter is not None
    divergence = compare_traces(ref, shorter)
    assert divergence is not None and divergence.position == 2 and not divergence.near_tie
    assert ">end<" in divergence.describe("x", "y", 0.05)
    no_top = parse_trace({"choices": [{"token_ids": [5, 9, 7]}]})
    assert no_top is not None and top2_gap(no_top, 1) is None
    divergence = compare_traces(ref, no_top)
    assert divergence is not None and not divergence.near_tie


def test_prefix_cache_hit_checks_logprobs_within_tolerance() -> None:
    ref = parse_trace(answer([5, 6, 7], chosen=[-0.5, -0.5, -0.5]))
    close = parse_trace(answer([5, 6, 7], chosen=[-0.5, -0.51, -0.5]))
    moved = parse_trace(answer([5, 6, 7], chosen=[-0.5, -0.5, -1.7]))
    assert ref is not None and close is not None and moved is not None
    assert compare_traces(ref, close, logprob_tolerance=0.05) is None
    assert compare_traces(ref, moved) is None  # ids only, without a tolerance
    divergence = compare_traces(ref, moved, logprob_tolerance=0.05)
    assert divergence is not None and divergence.position is None and divergence.logprob_position == 2
    request = SmokeRequest(
        "prefix_cache:2", "prefix_cache", "/v1/completions", {"model": "m"}, check_logprobs=True
    )
    reference = SmokeRequest("prefix_cache:1", "prefix_cache", "/v1/completions", {"model": "m"})
    ref_ex = Exchange(200, answer([5, 6, 7]))
    ex = Exchange(200, answer([5, 6, 7], chosen=[-0.5, -0.5, -1.7]))
    judged = judge_consistency(request, judge(request, ex), ex, reference, judge(reference, ref_ex), ref_ex)
    assert not judged.passed
    assert (
        "prefix-cache hit" in judged.diagnosis and "moved by 1.2 at generated position 2" in judged.diagnosis
    )


def test_failed_answers_are_not_compared_and_keep_their_own_diagnosis() -> None:
    request = SmokeRequest("repeat:2", "repeat", "/v1/completions", {"model": "m"}, compare_to="repeat:1")
    reference = SmokeRequest("repeat:1", "repeat", "/v1/completions", {"model": "m"})
    nan = Exchange(400, {"error": {"message": "Out of range float values are not JSON compliant"}})
    good = Exchange(200, answer([5, 6, 7]))
    failed = judge(request, nan)
    assert judge_consistency(request, failed, nan, reference, judge(reference, good), good) is failed
    assert "NaN" in failed.diagnosis and not failed.miss
    assert failed.diagnosis.endswith("(the same greedy request again: repeat:1 had a good answer before)")
    judged = judge_consistency(request, judge(request, good), good, reference, judge(reference, nan), nan)
    assert judged.passed and judged.warning == "not compared: repeat:1 failed"


@pytest.mark.parametrize(
    ("exchange", "miss"),
    [
        (Exchange(timed_out=True, timeout_s=5), True),
        (Exchange(transport_error="ConnectError: refused"), True),
        (Exchange(503, {"error": {"message": "overloaded"}}), True),
        (Exchange(429, {"error": {"message": "slow down"}}), True),
        (Exchange(500, {"error": {"message": "Out of range float values are not JSON compliant"}}), False),
        (Exchange(404, {"error": {"message": "model not found"}}), False),
        (Exchange(200, answer([0, 0, 0])), False),
    ],
)
def test_slowness_is_a_miss_and_wrong_output_is_not(exchange: Exchange, miss: bool) -> None:
    result = judge(SmokeRequest("repeat:1", "repeat", "/v1/completions", {"model": "m"}), exchange)
    assert not result.passed and result.miss is miss


def test_case_result_rows_without_the_new_fields_still_load() -> None:
    old = {"name": "c", "kind": "completion", "endpoint": "/v1/completions", "model": "m", "passed": True}
    assert CaseResult.model_validate(old).warning == "" and not CaseResult.model_validate(old).miss
