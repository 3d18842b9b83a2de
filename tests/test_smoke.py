"""The smoke verdict rules on answers shaped like vLLM's, and the HTTP layer against a real local server.

The answers below copy the shape vLLM 0.32 returns (see the end-to-end tests for the real thing): the
verdict must fail each silent failure with a diagnosis a person understands, and pass a good answer.
"""

from __future__ import annotations

import json
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from deploykit.profile.load import load_profile
from deploykit.profile.schema import Profile, SmokeCase
from deploykit.smoke import (
    FIRST_IDS_KEPT,
    LORA_LONG_MIN_PROMPT_TOKENS,
    Exchange,
    SmokeRequest,
    derive_cases,
    judge,
    run_smoke,
    smoke_image_png,
    smoke_requests,
    special_token_ids,
    summarise,
)

COMPLETION = SmokeRequest("completion", "completion", "/v1/completions", {"model": "tiny"})
CHAT = SmokeRequest("chat", "chat", "/v1/chat/completions", {"model": "tiny"})
SPECIALS = frozenset({0, 1, 2, 3})


def completion_body(
    ids: list[int] | None = None,
    text: str | None = " a small dog",
    finish: str = "length",
    logprobs: list[float] | None = None,
    prompt_tokens: int = 5,
) -> dict[str, Any]:
    ids = [47, 76, 83, 274] if ids is None else ids
    values = [-1.5] * len(ids) if logprobs is None else logprobs
    return {
        "object": "text_completion",
        "choices": [
            {
                "index": 0,
                "text": text,
                "logprobs": {
                    "tokens": ["x"] * len(values),
                    "token_logprobs": values,
                    "top_logprobs": [{"x": v} for v in values],
                },
                "finish_reason": finish,
                "token_ids": ids,
                "prompt_token_ids": [5, 6, 7],
            }
        ],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(ids) if ids else 0},
    }


def chat_body(
    ids: list[int] | None = None, content: str | None = "Sunny.", logprob: float = -0.7
) -> dict[str, Any]:
    ids = [300, 301, 302] if ids is None else ids
    entries = [{"token": "x", "logprob": logprob, "top_logprobs": [{"token": "x", "logprob": logprob}]}]
    return {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": {"content": entries * len(ids)},
                "finish_reason": "length",
                "token_ids": ids,
            }
        ],
        "prompt_token_ids": [5, 47, 80],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)},
    }


def ok(body: Any, latency: float = 0.5) -> Exchange:
    return Exchange(status_code=200, body=body, raw_text=json.dumps(body), latency_s=latency)


# --- the rules -------------------------------------------------------------------------------------


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


# --- which cases -----------------------------------------------------------------------------------


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


def test_test_image_is_a_valid_png() -> None:
    data = smoke_image_png(16)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, chunks = 8, {}
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        tag, payload = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(tag + payload)
        chunks[tag] = payload
        offset += 12 + length
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    assert (width, height) == (16, 16)
    assert len(zlib.decompress(chunks[b"IDAT"])) == 16 * (1 + 3 * 16)


def test_special_ids_read_from_the_tiny_model(tiny_model_dir: Path) -> None:
    ids = special_token_ids(tiny_model_dir)
    tokenizer = json.loads((tiny_model_dir / "tokenizer.json").read_text())
    assert ids == {t["id"] for t in tokenizer["added_tokens"] if t["special"]}
    assert 0 in ids and len(ids) == 8
    assert special_token_ids(None) == frozenset()
    assert special_token_ids(tiny_model_dir / "missing") == frozenset()


# --- over real HTTP --------------------------------------------------------------------------------


class _Canned(BaseHTTPRequestHandler):
    """Answers by the requested model name: a way to exercise each HTTP outcome."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, self.headers.get("Authorization"), body))  # type: ignore[attr-defined]
        model = body["model"]
        if model == "slow":
            time.sleep(2)
        if model == "nan":
            status, text = 200, '{"choices": [{"text": "x", "finish_reason": "length", "token_ids": [5], '
            text += '"logprobs": {"token_logprobs": [NaN], "top_logprobs": [{"x": NaN}]}}]}'
        elif model == "broken":
            status, text = 500, "Internal Server Error"
        else:
            status, text = 200, json.dumps(completion_body())
        payload = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def canned_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_run_smoke_over_http(canned_server: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{canned_server.server_address[1]}"

    def request(model: str) -> SmokeRequest:
        return SmokeRequest(model, "completion", "/v1/completions", {"model": model, "prompt": "p"})

    names = ["good", "nan", "broken", "slow"]
    report = run_smoke(url, [request(n) for n in names], timeout_s=0.5, api_key="k-123456")
    results = {case.name: case for case in report.cases}
    assert results["good"].passed
    assert "NaN or infinite" in results["nan"].diagnosis
    assert results["broken"].diagnosis == "HTTP 500: Internal Server Error"
    assert results["slow"].diagnosis == "timeout: no answer within 0.5 s"
    assert not report.passed
    assert all(auth == "Bearer k-123456" for _, auth, _ in canned_server.seen)  # type: ignore[attr-defined]
    refused = run_smoke("http://127.0.0.1:9", [request("good")], timeout_s=2)
    assert "request failed" in refused.cases[0].diagnosis
