"""The smoke verdict rules on answers shaped like vLLM's 0.32 (see the end-to-end tests for the real thing):
the verdict must fail each silent failure with a diagnosis a person understands, and pass a good answer.
"""

from __future__ import annotations

import json

import pytest

from deploykit.smoke import (
    FIRST_IDS_KEPT,
    Exchange,
    SmokeRequest,
    judge,
    summarise,
)
from tests.smoke.answers import chat_body, completion_body, ok

COMPLETION = SmokeRequest("completion", "completion", "/v1/completions", {"model": "tiny"})
CHAT = SmokeRequest("chat", "chat", "/v1/chat/completions", {"model": "tiny"})
SPECIALS = frozenset({0, 1, 2, 3})


def test_good_completion_and_chat_pass_and_record_what_came_back() -> None:
    ids = list(range(100, 140))
    result = judge(COMPLETION, ok(completion_body(ids=ids), latency=2.0), SPECIALS)
    assert result.passed, result.diagnosis
    assert result.first_ids == ids[:FIRST_IDS_KEPT]
    assert result.finish_reason == "length"
    assert result.tokens_per_s == pytest.approx(40 / 2.0)
    assert result.latency_s == 2.0
    chat = judge(CHAT, ok(chat_body()), SPECIALS)
    assert chat.passed, chat.diagnosis
    assert chat.text == "Sunny."


def test_missing_token_ids_fail() -> None:
    body = completion_body()
    body["choices"][0]["token_ids"] = None
    result = judge(COMPLETION, ok(body))
    assert not result.passed
    assert "no token ids" in result.diagnosis


def test_no_generated_tokens_fail() -> None:
    result = judge(COMPLETION, ok(completion_body(ids=[], text="", finish="stop")))
    assert not result.passed
    assert "generated no tokens" in result.diagnosis


def test_every_id_zero_fails_even_with_text_and_finite_logprobs() -> None:
    result = judge(COMPLETION, ok(completion_body(ids=[0] * 16, text="<pad>" * 16)))
    assert not result.passed
    assert "every generated id is 0 or a special/pad token" in result.diagnosis
    assert result.first_ids == [0] * 16


def test_every_id_special_fails_but_one_word_among_specials_passes() -> None:
    assert not judge(COMPLETION, ok(completion_body(ids=[2, 1, 3])), SPECIALS).passed
    # Without knowing the specials only id 0 is suspicious: the same answer passes.
    assert judge(COMPLETION, ok(completion_body(ids=[2, 1, 3])), frozenset()).passed
    assert judge(COMPLETION, ok(completion_body(ids=[2, 0, 999])), SPECIALS).passed


@pytest.mark.parametrize("content", [None, ""])
def test_no_text_while_finish_reason_is_length_fails(content: str | None) -> None:
    result = judge(CHAT, ok(chat_body(content=content)))
    assert not result.passed
    assert "while finish_reason is `length`" in result.diagnosis
    # The same empty text is fine when generation stopped on its own (an immediate end of sequence).
    body = chat_body(content=content)
    body["choices"][0]["finish_reason"] = "stop"
    assert judge(CHAT, ok(body)).passed


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logprobs_fail_in_completions_and_chat(bad: float) -> None:
    # vLLM's JSON can carry NaN/Infinity literals; json.loads reads them back as floats.
    text = json.dumps(completion_body(logprobs=[-1.0, bad, -2.0, -0.5]))
    result = judge(COMPLETION, Exchange(status_code=200, body=json.loads(text), raw_text=text))
    assert not result.passed
    assert "logprobs are NaN or infinite" in result.diagnosis
    chat = judge(CHAT, ok(chat_body(logprob=bad)))
    assert not chat.passed
    assert "NaN or infinite" in chat.diagnosis


def test_out_of_range_float_error_is_diagnosed_as_nan() -> None:
    # What vLLM 0.32 answers when the logprobs it must encode are NaN (measured with the NaN tiny model).
    body = {"error": {"message": "Out of range float values are not JSON compliant", "code": 400}}
    result = judge(COMPLETION, Exchange(status_code=400, body=body, raw_text=json.dumps(body)))
    assert not result.passed
    assert result.http_status == 400
    assert "float values are out of range" in result.diagnosis
    assert "NaN or infinite" in result.diagnosis


def test_http_errors_name_the_status_and_a_hint() -> None:
    unauthorized = judge(COMPLETION, Exchange(status_code=401, body={"error": "Unauthorized"}, raw_text=""))
    assert "HTTP 401" in unauthorized.diagnosis and "API key" in unauthorized.diagnosis
    body = {"error": {"message": "The model `nope` does not exist.", "code": 404}}
    missing = judge(COMPLETION, Exchange(status_code=404, body=body, raw_text=json.dumps(body)))
    assert "HTTP 404" in missing.diagnosis and "does not exist" in missing.diagnosis
    plain = judge(COMPLETION, Exchange(status_code=502, body=None, raw_text="Bad Gateway"))
    assert plain.diagnosis == "HTTP 502: Bad Gateway"


def test_timeout_and_transport_error_fail() -> None:
    timed_out = judge(COMPLETION, Exchange(timed_out=True, timeout_s=30, latency_s=30.0))
    assert not timed_out.passed and timed_out.diagnosis == "timeout: no answer within 30 s"
    refused = judge(COMPLETION, Exchange(transport_error="ConnectError: refused"))
    assert not refused.passed and "ConnectError" in refused.diagnosis


def test_expected_substring() -> None:
    request = SmokeRequest("completion", "completion", "/v1/completions", {"model": "m"}, "dog")
    assert judge(request, ok(completion_body(text=" a small dog"))).passed
    missing = judge(request, ok(completion_body(text=" a cat")))
    assert not missing.passed and "expected 'dog'" in missing.diagnosis


def test_lora_long_case_checks_the_prompt_was_long() -> None:
    request = SmokeRequest("lora_long", "lora_long", "/v1/completions", {"model": "a"}, min_prompt_tokens=400)
    assert judge(request, ok(completion_body(prompt_tokens=600))).passed
    short = judge(request, ok(completion_body(prompt_tokens=120)))
    assert not short.passed and "only 120 tokens" in short.diagnosis


def test_summary_names_each_failing_case() -> None:
    good = judge(COMPLETION, ok(completion_body()))
    bad = judge(CHAT, ok(chat_body(ids=[0, 0])))
    report = summarise([good, bad])
    assert not report.passed
    assert report.diagnosis.startswith("chat: every generated id is 0")
    assert summarise([good]).passed
    assert not summarise([]).passed


# --- issue 31: odd and impossible answers are `wrong`, in one line, never a traceback -------------------

ASKED = SmokeRequest("asked", "completion", "/v1/completions", {"model": "tiny", "logprobs": 1})
ASKED_CHAT = SmokeRequest(
    "asked-chat", "chat", "/v1/chat/completions", {"model": "tiny", "logprobs": True, "top_logprobs": 1}
)


def _completion_with(**changes: object) -> dict[str, object]:
    body = completion_body()
    choice = body["choices"][0]
    for key, value in changes.items():
        if key in ("prompt_tokens", "completion_tokens"):
            body["usage"][key] = value
        else:
            choice[key] = value
    return body


ODD_SHAPES = [
    ("text as a number", _completion_with(text=42), "choices.0.text"),
    ("completion_tokens as a string", _completion_with(completion_tokens="4"), "usage.completion_tokens"),
    ("prompt_tokens as a string", _completion_with(prompt_tokens="5"), "usage.prompt_tokens"),
    ("prompt_tokens 10**30", _completion_with(prompt_tokens=10**30), "usage.prompt_tokens"),
    ("completion_tokens negative", _completion_with(completion_tokens=-4), "usage.completion_tokens"),
    ("token id Infinity", _completion_with(token_ids=[47, float("inf")]), "choices.0.token_ids.1"),
    ("token id 47.7", _completion_with(token_ids=[47.7, 76]), "choices.0.token_ids.0"),
    ("token id true", _completion_with(token_ids=[True, 76]), "choices.0.token_ids.0"),
    ('token id "5"', _completion_with(token_ids=["5", 76]), "choices.0.token_ids.0"),
    ("token ids as a string", _completion_with(token_ids="47"), "choices.0.token_ids"),
    ("choices as a dict", {"choices": {"0": {}}}, "choices"),
    ("a logprob as a word", _completion_with(logprobs={"token_logprobs": ["low"] * 4}), "token_logprobs"),
]


@pytest.mark.parametrize(("what", "body", "where"), ODD_SHAPES, ids=[case[0] for case in ODD_SHAPES])
def test_odd_shapes_are_wrong_in_one_line(what: str, body: object, where: str) -> None:
    result = judge(ASKED, ok(body))
    assert not result.passed and not result.miss, result
    assert "\n" not in result.diagnosis and where in result.diagnosis, result.diagnosis
    assert result.model_dump_json()  # the row stores it, and reads back what it stored
    assert type(result).model_validate_json(result.model_dump_json()) == result


def test_content_as_a_list_in_chat_is_wrong_not_a_pass() -> None:
    body = chat_body()
    body["choices"][0]["message"]["content"] = [{"type": "text", "text": "Sunny."}]
    result = judge(ASKED_CHAT, ok(body))
    assert not result.passed and "choices.0.message.content" in result.diagnosis
    assert result.text is None


@pytest.mark.parametrize("bad", [-1, 10**30, 2**31], ids=["negative", "10**30", "2**31"])
def test_impossible_ids_fail_without_a_vocabulary(bad: int) -> None:
    result = judge(ASKED, ok(completion_body(ids=[47, bad, 83])))
    assert not result.passed and "impossible" in result.diagnosis and "int32" in result.diagnosis
    assert result.first_ids == []  # nothing impossible is stored as an id


def test_ids_beyond_the_models_vocabulary_fail() -> None:
    body = completion_body(ids=[47, 32000, 83])
    assert judge(ASKED, ok(body), vocab_size=32001).passed
    result = judge(ASKED, ok(body), vocab_size=32000)
    assert not result.passed and "outside 0..31999, the model's vocabulary of 32000" in result.diagnosis


def test_missing_logprobs_fail_where_the_request_asked_for_them() -> None:
    dropped = completion_body()
    del dropped["choices"][0]["logprobs"]
    result = judge(ASKED, ok(dropped))
    assert not result.passed and "no logprobs though the request asked for them" in result.diagnosis
    assert judge(COMPLETION, ok(dropped)).passed  # not asked: not required
    short = completion_body(ids=[47, 76, 83], logprobs=[-1.0])
    assert "logprobs came for 1 of 3 generated tokens" in judge(ASKED, ok(short)).diagnosis
    chat = chat_body()
    chat["choices"][0]["logprobs"] = None
    assert "no logprobs" in judge(ASKED_CHAT, ok(chat)).diagnosis


@pytest.mark.parametrize("word", ["NaN", "Infinity", "-Infinity"])
def test_nan_sent_as_a_string_is_nan(word: str) -> None:
    body = completion_body()
    body["choices"][0]["logprobs"]["token_logprobs"][1] = word
    result = judge(ASKED, ok(body))
    assert not result.passed and "NaN or infinite" in result.diagnosis
    chat = chat_body()
    chat["choices"][0]["logprobs"]["content"][0]["logprob"] = word
    assert "NaN or infinite" in judge(ASKED_CHAT, ok(chat)).diagnosis


def test_an_answer_over_its_cap_is_wrong_not_a_miss() -> None:
    exchange = Exchange(status_code=200, too_big="the answer is over the 16 MiB cap (reading stopped there)")
    result = judge(ASKED, exchange)
    assert not result.passed and not result.miss and "16 MiB cap" in result.diagnosis
