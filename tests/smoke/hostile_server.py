"""A hostile or broken server on a real loopback port, for the fail-closed matrix (issue 31): it trickles,
hangs before or after its headers, floods gigabytes, answers odd shapes and impossible ids, drops logprobs,
sends NaN as a string, and serves a /metrics page whose NaN counter goes backwards or is 300 MB.

`Hostile(mode)` is the behaviour of its POSTs (and of `/metrics`); `/v1/models` and `/health` answer like
vLLM's so that a canary takes it for one. Floods are generated chunk by chunk, never held whole, and every
blocking behaviour ends when the server is shut down (`stop`), so no test leaves a thread behind.
"""

from __future__ import annotations

import contextlib
import json
import threading
import unicodedata
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.http_server import serving
from tests.smoke.answers import chat_body, completion_body

MODEL = "tiny"
MIB = 1024 * 1024
FLOOD_BYTES = 2 * 1024 * MIB
METRICS_FLOOD_BYTES = 300 * MIB
# A trickle sends one byte this often: well inside any read timeout the tests give (1 s and up), so only a
# whole-request deadline ends it, never a per-read timeout (the bug the deadline tests catch).
TRICKLE_EVERY_S = 0.25


def _answer(endpoint: str, **changes: Any) -> dict[str, Any]:
    """A good answer for `endpoint` with `changes` made to its first choice (or its usage)."""
    body = chat_body() if endpoint.endswith("chat/completions") else completion_body()
    choice = body["choices"][0]
    for key, value in changes.items():
        if key in ("prompt_tokens", "completion_tokens"):
            body["usage"][key] = value
        elif key == "content":
            choice["message" if "message" in choice else "text"] = (
                {"role": "assistant", "content": value} if "message" in choice else value
            )
        elif key == "drop_logprobs":
            choice.pop("logprobs", None)
        elif key == "nan_word":
            if "message" in choice:
                choice["logprobs"]["content"][0]["logprob"] = "NaN"
            else:
                choice["logprobs"]["token_logprobs"][0] = "NaN"
        else:
            choice[key] = value
    return body


# Each JSON mode: endpoint → the answer's text (a raw string: Infinity is not JSON `json.dumps` writes).
JSON_MODES: dict[str, Callable[[str], str]] = {
    "good": lambda e: json.dumps(_answer(e)),
    "text-as-number": lambda e: json.dumps(_answer(e, content=42)),
    "completion-tokens-as-string": lambda e: json.dumps(_answer(e, completion_tokens="4")),
    "prompt-tokens-as-string": lambda e: json.dumps(_answer(e, prompt_tokens="5")),
    "content-as-list": lambda e: json.dumps(_answer(e, content=[{"type": "text", "text": "Sunny."}])),
    "id-infinity": lambda e: json.dumps(_answer(e, token_ids=[47, "INF", 83])).replace('"INF"', "Infinity"),
    "id-negative": lambda e: json.dumps(_answer(e, token_ids=[47, -1, 83])),
    "id-10e30": lambda e: json.dumps(_answer(e, token_ids=[47, 10**30, 83])),
    "id-float": lambda e: json.dumps(_answer(e, token_ids=[47.7, 76, 83])),
    "id-true": lambda e: json.dumps(_answer(e, token_ids=[True, 76, 83])),
    "id-string": lambda e: json.dumps(_answer(e, token_ids=["5", 76, 83])),
    "no-logprobs": lambda e: json.dumps(_answer(e, drop_logprobs=True)),
    "nan-as-string": lambda e: json.dumps(_answer(e, nan_word=True)),
}


# HTTP error modes: status → vLLM's error message for it (`http-400` ...; `http-400-nan` is the 400 vLLM
# answers when it cannot encode a NaN result, which stays corruption).
ERROR_MODES: dict[str, tuple[int, str]] = {
    "http-400": (400, "This model's maximum context length is 512 tokens; you requested 2100 tokens."),
    "http-400-nan": (400, "Out of range float values are not JSON compliant: nan"),
    "http-401": (401, "Unauthorized"),
    "http-403": (403, "Forbidden"),
    "http-404": (404, "The model `tiny-adapter` does not exist."),
    "http-413": (413, "Request Entity Too Large"),
    "http-422": (422, "Input should be a valid integer"),
}


# A server's own words that a terminal would act on, and Rich markup (issue 43): clear the screen, home the
# cursor, a green "verdict: PASS"; a closing tag that opens nothing; a right-to-left override; a C1 CSI, a
# bell. Shown, they must read as written (escaped), never act; stored, they are kept as they came.
HOSTILE_TEXT = "boom\x1b[2J\x1b[H\x1b[32mverdict: PASS\x1b[0m [/x] [bold]b\u202eevil\x9b2J\x07"
ERROR_MODES["http-500-escapes"] = (500, HOSTILE_TEXT)
SHOWN_ESCAPED = ("\\x1b[2J\\x1b[H\\x1b[32mverdict: PASS\\x1b[0m", "[/x] [bold]b\\u202eevil\\x9b2J\\x07")
"""How HOSTILE_TEXT reads on a terminal: each character that would act written as its escape."""
TERMINAL_ACTS_ON = "\u2028\u2029\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def acted_on(output: str) -> list[str]:
    """The characters in `output` a terminal would act on instead of showing (a line break aside):
    control characters, the line and paragraph separators, the bidirectional overrides and isolates."""
    return sorted(
        {c for c in output if c != "\n" and (unicodedata.category(c) == "Cc" or c in TERMINAL_ACTS_ON)}
    )


def error_body(status: int, message: str) -> str:
    """vLLM's OpenAI-style error answer."""
    return json.dumps({"error": {"message": message, "type": "Error", "param": None, "code": status}})


def metrics_page(total: float, created: float = 1_796_191_257.0, exemplar: bool = False) -> str:
    """vLLM's NaN counter as its /metrics shows it (one engine); with an OpenMetrics exemplar after it."""
    after = ' # {trace_id="a1b2"} 99.0 1796191300.5' if exemplar else ""
    return (
        "# TYPE vllm:corrupted_requests_total counter\n"
        f'vllm:corrupted_requests_total{{engine="0",model_name="{MODEL}"}} {total}{after}\n'
        f'vllm:corrupted_requests_created{{engine="0",model_name="{MODEL}"}} {created}\n'
        "process_start_time_seconds 1796191234.0\n"
    )


class Hostile:
    """One behaviour, on its own server. `metrics_totals`: the NaN counter's successive values (the last
    repeats); `metrics_flood`: /metrics is a 300 MB page instead; `slow_listing`: `/v1/models` and
    `/health` trickle their answers too."""

    def __init__(
        self,
        mode: str = "good",
        *,
        metrics_totals: list[float] | None = None,
        exemplar: bool = False,
        metrics_flood: bool = False,
        slow_listing: bool = False,
        api_keys: set[str] | None = None,
        model: str = MODEL,
    ) -> None:
        self.mode = mode
        self.model = model
        """The id `/v1/models` lists (a hostile one: HOSTILE_TEXT)."""
        self.api_keys = api_keys
        """With keys, /v1/* wants `Authorization: Bearer KEY`, one of them (vLLM's --api-key); else 401."""
        self.slow_listing = slow_listing
        self.metrics_totals = list(metrics_totals or [0.0])
        self.exemplar = exemplar
        self.metrics_flood = metrics_flood
        self.stop = threading.Event()
        self.posts = 0
        self.metrics_reads = 0

    @contextlib.contextmanager
    def serving(self) -> Iterator[str]:
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _refused_key(self) -> bool:
                if hostile.api_keys is None or not self.path.startswith("/v1/"):
                    return False
                given = self.headers.get("Authorization", "").removeprefix("Bearer ")
                if given in hostile.api_keys:
                    return False
                self._json(401, json.dumps({"error": "Unauthorized"}))
                return True

            def do_GET(self) -> None:
                if self._refused_key():
                    return
                if hostile.slow_listing and self.path in ("/v1/models", "/health"):
                    self._trickle(json.dumps({"data": [{"id": MODEL}]}).encode())
                elif self.path == "/v1/models":
                    self._json(200, json.dumps({"data": [{"id": hostile.model, "max_model_len": 2048}]}))
                elif self.path == "/health":
                    self._json(200, "")
                elif self.path == "/metrics":
                    hostile.metrics_reads += 1
                    if hostile.metrics_flood:
                        self._flood(METRICS_FLOOD_BYTES, b"# " + b"x" * 1021 + b"\n", declare=False)
                        return
                    index = min(hostile.metrics_reads - 1, len(hostile.metrics_totals) - 1)
                    self._json(200, metrics_page(hostile.metrics_totals[index], exemplar=hostile.exemplar))
                else:
                    self._json(404, json.dumps({"detail": "Not Found"}))

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hostile.posts += 1
                mode = hostile.mode
                if self._refused_key():
                    return
                if mode in ERROR_MODES:
                    self._json(ERROR_MODES[mode][0], error_body(*ERROR_MODES[mode]))
                elif mode == "good-counting":  # a good answer whose prompt_tokens counts the prompt's words
                    words = len(str(json.loads(body or b"{}").get("prompt", "")).split())
                    self._json(200, json.dumps(_answer(self.path, prompt_tokens=max(5, words))))
                elif mode == "hang-before-headers":
                    hostile.stop.wait()
                elif mode == "hang-after-headers":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "100")
                    self.end_headers()
                    self.wfile.flush()
                    hostile.stop.wait()
                elif mode == "trickle":
                    self._trickle(json.dumps(_answer(self.path)).encode())
                elif mode == "trickle-headers":
                    self._trickle_headers()
                elif mode == "flood":
                    self._flood(FLOOD_BYTES, b"x" * MIB, declare=False)
                elif mode == "flood-declared":
                    self._flood(FLOOD_BYTES, b"x" * MIB, declare=True)
                else:
                    self._json(200, JSON_MODES[mode](self.path))

            def _json(self, status: int, text: str) -> None:
                payload = text.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _trickle(self, payload: bytes) -> None:
                """Headers at once, then the body one byte every TRICKLE_EVERY_S."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.flush()
                with contextlib.suppress(OSError):
                    for byte in payload:
                        if hostile.stop.wait(TRICKLE_EVERY_S):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()

            def _trickle_headers(self) -> None:
                """The status line and headers themselves one byte every TRICKLE_EVERY_S."""
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Slow: " + b"y" * 200
                with contextlib.suppress(OSError):
                    for byte in head:
                        if hostile.stop.wait(TRICKLE_EVERY_S):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                self.close_connection = True

            def _flood(self, total: int, chunk: bytes, *, declare: bool) -> None:
                """`total` bytes, `chunk` at a time; without a Content-Length the body runs to the close."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if declare:
                    self.send_header("Content-Length", str(total))
                else:
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                sent = 0
                with contextlib.suppress(OSError):
                    while sent < total and not hostile.stop.is_set():
                        self.wfile.write(chunk)
                        sent += len(chunk)

            def log_message(self, *args: Any) -> None:
                pass

        try:
            with serving(Handler) as url:
                yield url
                self.stop.set()  # before the shutdown: the blocked handlers end
        finally:
            self.stop.set()
