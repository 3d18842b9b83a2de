"""The smoke over real HTTP: a local server answering each outcome (good, NaN, HTTP 500, too slow,
refused)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from deploykit.endpoint import Endpoint
from deploykit.smoke import SmokeRequest, run_smoke
from tests.http_server import serving
from tests.smoke.answers import completion_body


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
def canned_server() -> Iterator[Any]:
    """The canned server (tests/http_server.py); `seen` holds each request's path, Authorization, body."""
    with serving(_Canned, seen=[]) as url:
        yield url.server


def test_run_smoke_over_http(canned_server: Any) -> None:
    url = f"http://127.0.0.1:{canned_server.server_address[1]}"

    def request(model: str) -> SmokeRequest:
        return SmokeRequest(model, "completion", "/v1/completions", {"model": model, "prompt": "p"})

    names = ["good", "nan", "broken", "slow"]
    report = run_smoke(Endpoint(url, api_key="k-123456", request_deadline_s=0.5), [request(n) for n in names])
    results = {case.name: case for case in report.cases}
    assert results["good"].passed
    assert "NaN or infinite" in results["nan"].diagnosis
    assert results["broken"].diagnosis == "HTTP 500: Internal Server Error"
    assert results["slow"].diagnosis == "timeout: no answer within 0.5 s"
    assert not report.passed
    assert all(auth == "Bearer k-123456" for _, auth, _ in canned_server.seen)  # type: ignore[attr-defined]
    refused = run_smoke(Endpoint("http://127.0.0.1:9", request_deadline_s=2), [request("good")])
    assert "request failed" in refused.cases[0].diagnosis
