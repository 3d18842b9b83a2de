"""trace/run.py's launch: the planned argv made traceable through the one argv writer (deploykit.argv); its
requests, each with its own X-Request-Id beside the endpoint's key."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

from deploykit.argv import flag_switch, flag_value
from deploykit.endpoint import Endpoint
from deploykit.smoke import SmokeRequest
from deploykit.trace.run import send_cases, trace_argv
from tests.http_server import serving
from tests.smoke.answers import completion_body


def test_the_traced_argv_is_eager_one_sequence_on_its_port_whatever_the_plan_spelled() -> None:
    planned = ["vllm", "serve", "m", "--port=8000", "--max_num_seqs", "4", "--no-enforce-eager"]

    traced = trace_argv(planned, 9123)

    assert flag_value(traced, "--port") == "9123"
    assert flag_value(traced, "--max-num-seqs") == "1"
    assert flag_switch(traced, "--enforce-eager") is True
    assert [w for w in traced if w in ("--port=8000", "--max_num_seqs", "4", "--no-enforce-eager")] == []


class _Seen(BaseHTTPRequestHandler):
    """Answers every completion alike and keeps each request's X-Request-Id and Authorization."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.seen.append((self.headers.get("X-Request-Id"), self.headers.get("Authorization")))  # type: ignore[attr-defined]
        payload = json.dumps(completion_body()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


def test_each_traced_request_carries_its_request_id_and_the_endpoints_key() -> None:
    """The hooks name each trace by its X-Request-Id; the key's header comes from the endpoint beside it."""
    requests = [
        SmokeRequest(name, "completion", "/v1/completions", {"model": "m", "prompt": "p"})
        for name in ("a", "b#2")
    ]
    with serving(_Seen, seen=[]) as url:
        results, names = send_cases(Endpoint(url, api_key="sk-trace"), requests, special_ids=frozenset())
    assert [r.passed for r in results] == [True, True], [r.diagnosis for r in results]
    assert url.server.seen == [(rid, "Bearer sk-trace") for rid in names]
    assert list(names.values()) == ["a", "b#2"] and list(names) == ["dktrace-0-a", "dktrace-1-b_2"]
