"""The load sample against real HTTP servers that stream as vLLM does, and hostile ones: an error inside a
200 stream, an endless stream, a stalled one. Every read bounded; an answer that cannot be judged is never
counted as speed."""

from __future__ import annotations

import json
import time
from http.server import BaseHTTPRequestHandler

from deploykit.endpoint import Endpoint
from deploykit.gate import load_sample
from deploykit.gate.model import LoadPoint
from tests.http_server import serving


class Streams(BaseHTTPRequestHandler):
    """`/v1/completions` streams `max_tokens` ids in chunks of `server.per_chunk`; `/metrics` carries an
    inter-token latency histogram that grows by `server.itl` seconds per token streamed."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        mode = self.server.mode
        if mode == "error":
            self.wfile.write(
                b'data: {"error": {"message": "Token id 1126 is out of vocabulary"}}\n\ndata: [DONE]\n\n'
            )
            return
        left, per = body["max_tokens"], self.server.per_chunk
        while left > 0 or mode == "endless":
            n = min(per, left) if mode != "endless" else per
            event = {"choices": [{"index": 0, "text": "x", "token_ids": list(range(n))}]}
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            self.wfile.flush()
            self.server.tokens += n
            left -= n
            time.sleep(self.server.pause)
        self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self) -> None:
        tokens, labels = self.server.tokens, '{engine="0",model_name="tiny"}'
        page = (
            "# TYPE vllm:inter_token_latency_seconds histogram\n"
            f"vllm:inter_token_latency_seconds_sum{labels} {tokens * self.server.itl}\n"
            f"vllm:inter_token_latency_seconds_count{labels} {tokens}\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *_: object) -> None:
        pass


def run(url: str, streams: int = 2, deadline: float = 10.0, output_tokens: int = 16) -> LoadPoint:
    return load_sample.sample(
        Endpoint(url, request_deadline_s=deadline, metrics_deadline_s=2.0),
        "tiny",
        streams=streams,
        requests_per_stream=2,
        prompt_tokens=8,
        output_tokens=output_tokens,
    )


def test_tokens_are_counted_by_id_whatever_the_chunking_and_tpot_is_the_servers_own() -> None:
    with serving(Streams, mode="ok", per_chunk=3, pause=0.002, tokens=0, itl=0.004) as url:
        point = run(url)
    assert point.problem == ""
    assert point.requests == 4 and point.output_tokens == 4 * 16
    assert point.tpot_source == "server" and point.tpot_ms == 4.0
    assert point.tokens_per_s > 0 and point.ttft_ms is not None


def test_without_the_servers_histogram_tpot_is_the_clients() -> None:
    class NoMetrics(Streams):
        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with serving(NoMetrics, mode="ok", per_chunk=1, pause=0.003, tokens=0, itl=0.0) as url:
        point = run(url, streams=1)
    assert point.tpot_source == "client"
    assert point.tpot_ms is not None and point.tpot_ms >= 2.0  # the server paused 3 ms between tokens


def test_an_error_inside_a_200_stream_is_a_problem_never_a_fast_empty_answer() -> None:
    with serving(Streams, mode="error", per_chunk=1, pause=0.0, tokens=0, itl=0.0) as url:
        point = run(url)
    assert point.output_tokens == 0
    assert "out of vocabulary" in point.problem and "4 of 4" in point.problem


def test_a_stream_that_never_ends_is_cut_at_the_deadline_and_reported() -> None:
    with serving(Streams, mode="endless", per_chunk=1, pause=0.01, tokens=0, itl=0.0) as url:
        started = time.monotonic()
        point = run(url, streams=1, deadline=0.5)
    assert time.monotonic() - started < 5
    assert "no complete answer within 0.5 s" in point.problem


def test_a_short_answer_is_a_problem() -> None:
    with serving(Streams, mode="ok", per_chunk=4, pause=0.0, tokens=0, itl=0.0) as url:
        point = run(url, output_tokens=16)
        short = load_sample.summarise(1, [load_sample.StreamedAnswer(chunks=[(0.0, 3)])], 1.0, 16)
    assert point.problem == ""
    assert short.problem == "1 of 1 load request(s) incomplete: 3 of 16 tokens"


def test_the_best_of_repeated_samples_takes_each_figure_at_its_best_and_keeps_a_failure() -> None:
    slow = LoadPoint(streams=4, requests=8, output_tokens=800, wall_s=2, tokens_per_s=400, tpot_ms=3.0)
    fast = LoadPoint(streams=4, requests=8, output_tokens=800, wall_s=1, tokens_per_s=800, tpot_ms=6.0)
    best = load_sample.best([slow, fast])
    assert (best.tokens_per_s, best.tpot_ms) == (800, 3.0)
    assert (best.samples, best.tokens_per_s_worst, best.tpot_ms_worst) == (2, 400, 6.0)
    failed = fast.model_copy(update={"problem": "1 of 8 load request(s) incomplete: HTTP 500"})
    assert load_sample.best([slow, failed]).problem


def test_load_prompts_are_ordinary_ids_and_differ_per_request() -> None:
    prompts = [load_sample.prompt_ids(64, salt) for salt in range(20)]
    assert all(128 <= i < 256 for p in prompts for i in p)
    assert len({tuple(p[:16]) for p in prompts}) == 20
