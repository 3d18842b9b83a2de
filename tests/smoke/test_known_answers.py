"""Known answers (docs/known-answers.md): a profile's prompts with their greedy answers become smoke cases,
and a wrong answer fails with one line that shows what was expected and what came."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from deploykit.profile.load import load_profile
from deploykit.profile.schema import KnownAnswer, Profile, ProfileError
from deploykit.smoke import derive_cases, judge, requests_for_profile, summarise
from tests.smoke.answers import chat_body, completion_body, ok

CAPITAL = {
    "name": "capital",
    "kind": "chat",
    "prompt": "What is the capital of France?",
    "expect_substring": "Paris",
}
COUNT = {"name": "count", "kind": "completion", "prompt": "1, 2, 3,", "expect_ids": [220, 36, 28]}


def _profile(**smoke: Any) -> Profile:
    return Profile.model_validate({"name": "p", "model": {"source": "/m"}, "smoke": smoke})


def test_known_answers_run_beside_the_derived_cases_and_beside_a_profiles_own() -> None:
    derived = derive_cases(_profile(known_answers=[CAPITAL, COUNT]))
    assert [c.name or c.kind for c in derived] == [
        "completion",
        "chat",
        "repeat",
        "long_then_short",
        "known:capital",
        "known:count",
    ]
    own = derive_cases(_profile(cases=[{"kind": "completion"}], known_answers=[COUNT]))
    assert [c.name or c.kind for c in own] == ["completion", "known:count"]


def test_a_known_answer_is_asked_greedily_with_as_many_tokens_as_it_needs() -> None:
    requests = {r.name: r for r in requests_for_profile(_profile(known_answers=[CAPITAL, COUNT]))}
    chat, completion = requests["known:capital"], requests["known:count"]
    assert chat.endpoint == "/v1/chat/completions" and chat.expect_substring == "Paris"
    assert chat.body["messages"] == [{"role": "user", "content": CAPITAL["prompt"]}]
    assert chat.body["temperature"] == 0 and chat.body["max_tokens"] == 16
    assert completion.endpoint == "/v1/completions" and completion.expect_ids == (220, 36, 28)
    assert completion.body["prompt"] == "1, 2, 3," and completion.body["max_tokens"] == 3


def test_the_right_answer_passes() -> None:
    requests = {r.name: r for r in requests_for_profile(_profile(known_answers=[CAPITAL, COUNT]))}
    text = "The capital of France is Paris."
    assert judge(requests["known:capital"], ok(chat_body(content=text))).passed
    assert judge(requests["known:count"], ok(completion_body(ids=[220, 36, 28], text=" 4,"))).passed


def test_a_wrong_substring_fails_in_one_line_with_expected_and_got() -> None:
    request = next(
        r for r in requests_for_profile(_profile(known_answers=[CAPITAL])) if r.name == "known:capital"
    )
    result = judge(request, ok(chat_body(content="The capital of France is Lyon.")))
    assert not result.passed
    assert result.diagnosis == "expected 'Paris' in the text, got 'The capital of France is Lyon.'"
    line = summarise([result]).diagnosis
    assert line == "known:capital: expected 'Paris' in the text, got 'The capital of France is Lyon.'"
    assert "\n" not in line


def test_wrong_ids_fail_in_one_line_with_expected_and_got() -> None:
    request = next(
        r for r in requests_for_profile(_profile(known_answers=[COUNT])) if r.name == "known:count"
    )
    result = judge(request, ok(completion_body(ids=[220, 37, 28], text=" 5,")))
    assert not result.passed
    assert result.diagnosis == "expected ids [220, 36, 28] first, got [220, 37, 28] (' 5,')"
    short = judge(request, ok(completion_body(ids=[220], text=" ", finish="stop")))
    assert "expected ids [220, 36, 28] first, got [220]" in short.diagnosis


@pytest.mark.parametrize(
    ("change", "word"),
    [
        ({"expect_ids": [1]}, "exactly one of expect_substring and expect_ids"),
        ({"expect_substring": None}, "exactly one of expect_substring and expect_ids"),
        ({"expect_substring": ""}, "at least 1 character"),
        ({"name": "Bad Name"}, "pattern"),
        ({"kind": "repeat"}, "'completion' or 'chat'"),
        ({"prompt": ""}, "at least 1 character"),
    ],
)
def test_a_known_answer_that_cannot_be_checked_is_refused(change: dict[str, Any], word: str) -> None:
    with pytest.raises(ValidationError, match=word):
        KnownAnswer.model_validate({**CAPITAL, **change})


def test_fewer_tokens_than_expected_ids_and_twice_a_name_are_refused() -> None:
    with pytest.raises(ValidationError, match="fewer than the 3 expected ids"):
        KnownAnswer.model_validate({**COUNT, "max_tokens": 2})
    with pytest.raises(ValidationError, match="given more than once: capital"):
        _profile(known_answers=[CAPITAL, CAPITAL])


def test_a_profile_without_known_answers_keeps_its_id() -> None:
    """Ids (and the fingerprint baselines stored under them) predate the field and the case fields."""
    plain = _profile(cases=[{"kind": "completion", "expect_substring": "x"}])
    # computed at commit e3f5391, before known answers existed
    assert plain.profile_id() == "de577f6e941be41f290747f0e1fea68c986c5de374a46312c8b44dbfa9548f23"
    with_answer = _profile(cases=[{"kind": "completion", "expect_substring": "x"}], known_answers=[CAPITAL])
    assert with_answer.profile_id() != plain.profile_id()
    named = _profile(cases=[{"kind": "completion", "expect_substring": "x", "name": "mine"}])
    assert named.profile_id() != plain.profile_id()


def test_the_real_model_profile_ships_known_answers_for_completion_and_chat() -> None:
    answers = load_profile("smollm2-cpu").profile.smoke.known_answers
    assert {a.kind for a in answers} == {"completion", "chat"}
    assert any(a.expect_substring == "Paris" for a in answers)
    assert any(a.expect_ids for a in answers)


def test_a_broken_known_answer_in_a_profile_file_is_located(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(
        "name: x\nmodel:\n  source: /m\nsmoke:\n  known_answers:\n"
        "    - name: capital\n      prompt: What is the capital of France?\n"
        "    - name: count\n      kind: completion\n      prompt: '1, 2,'\n      expect_ids: [216, -1]\n"
    )
    with pytest.raises(ProfileError) as caught:
        load_profile(str(path))
    lines = [str(issue) for issue in caught.value.issues]
    assert any(
        line.startswith(f"{path}:6:7: smoke.known_answers[0]") and "exactly one of expect_substring" in line
        for line in lines
    ), lines
    assert any(
        line.startswith(f"{path}:11:") and "smoke.known_answers[1].expect_ids[1]" in line for line in lines
    ), lines
