"""Known answers in the canary's rotation: each is a case of its own, under its own name, with the tokens
its answer needs, and a wrong answer is a failed run whose line shows the expected and the got."""

from __future__ import annotations

import json
from functools import partial
from http.server import BaseHTTPRequestHandler
from typing import Any

from deploykit.canary.rotation import CANARY_MAX_TOKENS, case_labels, rotation_for, run_requests
from deploykit.endpoint import Endpoint
from deploykit.profile.load import load_profile
from deploykit.smoke import run_smoke
from tests.http_server import serving
from tests.smoke.answers import chat_body


def test_the_rotation_holds_each_known_answer_with_its_own_tokens() -> None:
    profile = load_profile("smollm2-cpu").profile
    rotation = rotation_for(profile)
    labels = case_labels(rotation)
    known = {answer.name: answer for answer in profile.smoke.known_answers}
    assert [label for label in labels if label.startswith("known:")] == [f"known:{name}" for name in known]
    for label, case in zip(labels, rotation, strict=True):
        if label.startswith("known:"):
            answer = known[label.removeprefix("known:")]
            wanted = answer.max_tokens or len(answer.expect_ids or ())
            assert case.max_tokens == wanted, label
        else:
            assert case.max_tokens <= CANARY_MAX_TOKENS, label


class _Answers(BaseHTTPRequestHandler):
    """A server that answers every chat request with the same words."""

    def __init__(self, words: str, *args: Any) -> None:
        self.words = words
        super().__init__(*args)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        data = json.dumps(chat_body(ids=[504, 3575, 282], content=self.words)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_canary_run_of_a_wrong_known_answer_fails_with_expected_and_got() -> None:
    profile = load_profile("smollm2-cpu").profile
    rotation = rotation_for(profile)
    number = case_labels(rotation).index("known:capital-of-france")
    requests = run_requests(rotation, number, profile.served_name, None, profile.serve.max_model_len)
    assert [r.name for r in requests] == ["known:capital-of-france"]
    with serving(partial(_Answers, "The capital of France is Paris.")) as url:
        assert run_smoke(Endpoint(url, request_deadline_s=10), requests).passed
    with serving(partial(_Answers, "The capital of France is Lyon.")) as url:
        report = run_smoke(Endpoint(url, request_deadline_s=10), requests)
    assert not report.passed
    assert report.diagnosis == (
        "known:capital-of-france: expected 'Paris' in the text, got 'The capital of France is Lyon.'"
    )
