"""Which requests a smoke sends: the cases a profile calls for, and their exact bodies."""

from __future__ import annotations

from typing import Any

from deploykit.profile.load import load_profile
from deploykit.profile.schema import Profile, SmokeCase
from deploykit.smoke import (
    LORA_LONG_MIN_PROMPT_TOKENS,
    derive_cases,
    first_adapter,
    requests_for_profile,
    smoke_requests,
)


def _profile(**overrides: Any) -> Profile:
    data: dict[str, Any] = {"name": "p", "model": {"source": "/models/m"}}
    data.update(overrides)
    return Profile.model_validate(data)


def test_cases_derived_from_the_profile() -> None:
    consistency = ["repeat", "long_then_short"]
    assert [c.kind for c in derive_cases(load_profile("demo-cpu").profile)] == [
        "completion",
        "chat",
        *consistency,
    ]
    multimodal = _profile(model={"source": "/m", "multimodal": True})
    assert [c.kind for c in derive_cases(multimodal)] == ["completion", "chat", "image", *consistency]
    lora = _profile(
        serve={"lora": {"enabled": True, "adapters": {"sql": "/a"}}}, workload={"penalties": True}
    )
    kinds = derive_cases(lora)
    assert [c.kind for c in kinds] == ["completion", "chat", "lora_long", "penalties", *consistency]
    assert kinds[2].adapter == "sql"
    explicit = _profile(smoke={"cases": [{"kind": "chat", "expect_substring": "hi"}]})
    assert [(c.kind, c.expect_substring) for c in derive_cases(explicit)] == [("chat", "hi")]


def test_requests_ask_for_token_ids_and_logprobs_greedily() -> None:
    cases = [
        SmokeCase(kind="completion"),
        SmokeCase(kind="chat"),
        SmokeCase(kind="image"),
        SmokeCase(kind="lora_long", adapter="sql"),
        SmokeCase(kind="penalties"),
        SmokeCase(kind="completion", prompt="again"),
    ]
    requests = smoke_requests(cases, "served")
    names = [r.name for r in requests]
    assert names == ["completion", "chat", "image", "lora_long", "lora_short", "penalties", "completion#2"]
    for request in requests:
        assert request.body["return_token_ids"] is True
        assert request.body["temperature"] == 0
        assert request.body["logprobs"] in (True, 1)
    by_name = {r.name: r for r in requests}
    assert by_name["lora_long"].model == by_name["lora_short"].model == "sql"
    assert by_name["lora_long"].min_prompt_tokens == LORA_LONG_MIN_PROMPT_TOKENS
    assert len(by_name["lora_long"].body["prompt"].split()) > LORA_LONG_MIN_PROMPT_TOKENS
    assert by_name["penalties"].body["repetition_penalty"] > 1
    image_part = by_name["image"].body["messages"][0]["content"][1]
    assert image_part["image_url"]["url"].startswith("data:image/png;base64,")


def test_requests_for_a_profile_use_its_served_name_and_first_adapter() -> None:
    lora = _profile(
        model={"source": "/m", "served_name": "base"},
        serve={"lora": {"enabled": True, "adapters": {"sql": "/a", "chat": "/b"}}},
    )
    requests = requests_for_profile(lora)
    assert [r.name for r in requests] == [r.name for r in smoke_requests(derive_cases(lora), "base", "sql")]
    models = {r.name: r.model for r in requests}
    assert models["completion"] == "base" and models["lora_long"] == models["lora_short"] == "sql"
    only_chat = requests_for_profile(lora, [SmokeCase(kind="chat")], served_name="other")
    assert [(r.name, r.model) for r in only_chat] == [("chat", "other")]
    assert first_adapter(_profile()) is None
