"""Smoke's fix check, client side: --expect-fixes parsing, the status route read, the diagnosis."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from deploykit.smoke.fix_check import (
    PLUGIN_NOT_LOADED,
    ServerFixStatus,
    fix_case,
    parse_expect_fixes,
    read_status,
)
from tests.http_server import serving

KNOWN = ("fp32_projection", "matmul_lora", "device_penalties")


def test_parse_expect_fixes() -> None:
    assert parse_expect_fixes("device_penalties, fp32_projection,device_penalties", KNOWN) == [
        "device_penalties",
        "fp32_projection",
    ]
    assert parse_expect_fixes("none", KNOWN) == [] and parse_expect_fixes("", KNOWN) == []
    with pytest.raises(ValueError, match=r"unknown fix\(es\) fp16.*known fixes: fp32_projection"):
        parse_expect_fixes("fp16", KNOWN)


class _Status(BaseHTTPRequestHandler):
    """The status route of a real loopback server: `answer(auth header) -> (status, body)` decides."""

    answer: Callable[[str | None], tuple[int, Any]]
    sent: list[str | None]

    def do_GET(self) -> None:
        assert self.path == "/deploykit/status"
        auth = self.headers.get("Authorization")
        self.sent.append(auth)
        status, body = self.answer(auth)
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _server(answer: Callable[[str | None], tuple[int, Any]]) -> Iterator[tuple[str, list[str | None]]]:
    sent: list[str | None] = []
    handler = type("Handler", (_Status,), {"answer": staticmethod(answer), "sent": sent})
    with serving(handler) as url:
        yield url, sent


def test_a_missing_route_means_the_plugin_is_not_loaded() -> None:
    with _server(lambda _: (404, {"detail": "Not Found"})) as (url, _):
        status = read_status(url + "/")
    assert status.route == "missing" and status.fixes_active == {}
    case = fix_case(["device_penalties", "fp32_projection"], status)
    assert not case.passed
    assert "device_penalties: " + PLUGIN_NOT_LOADED in case.diagnosis
    assert "fp32_projection: " + PLUGIN_NOT_LOADED in case.diagnosis


def test_active_fixes_pass_and_missing_ones_are_named() -> None:
    body = {
        "fixes_requested": ["device_penalties"],
        "fixes_active": {"device_penalties": "T"},
        "engine_error": None,
    }
    with _server(lambda _: (200, body)) as (url, _):
        status = read_status(url)
    assert status.fixes_active == {"device_penalties": "T"}
    assert fix_case(["device_penalties"], status).passed
    case = fix_case(["device_penalties", "fp32_projection"], status)
    assert (
        not case.passed
        and "fp32_projection: not requested: the server's DEPLOYKIT_FIXES is device_penalties"
        in case.diagnosis
    )
    assert "device_penalties:" not in case.diagnosis


def test_odd_shapes_in_the_status_answer_are_read_without_a_traceback() -> None:
    body = {"fixes_requested": "matmul_lora", "fixes_active": ["x"], "engine_error": {"a": 1}}
    with _server(lambda _: (200, body)) as (url, _):
        status = read_status(url)
    assert status.fixes_requested == [] and status.fixes_active == {}
    assert status.engine_error == "{'a': 1}"


def test_requested_but_not_applied_by_the_engine() -> None:
    status = ServerFixStatus(
        route="ok", fixes_requested=["matmul_lora"], fixes_active={}, engine_error="boom"
    )
    assert (
        "matmul_lora: requested, but the engine did not answer: boom"
        in fix_case(["matmul_lora"], status).diagnosis
    )


def test_an_unreachable_server_is_an_error_not_a_pass() -> None:
    with _server(lambda _: (200, {})) as (url, _):
        pass  # the port is free again: nothing answers there
    status = read_status(url)
    assert status.route == "error" and status.fixes_active is None
    assert "could not be read: ConnectionRefusedError" in fix_case(["matmul_lora"], status).diagnosis


def test_the_key_is_sent_and_a_refusal_says_why() -> None:
    def answer(auth: str | None) -> tuple[int, Any]:
        if auth == "Bearer sk-right":
            return 200, {"fixes_requested": ["matmul_lora"], "fixes_active": {"matmul_lora": "T"}}
        return 401, {"error": "Unauthorized"}

    with _server(answer) as (url, sent):
        assert read_status(url, api_key="sk-right").fixes_active == {"matmul_lora": "T"}
        wrong = read_status(url, api_key="sk-wrong")
        missing = read_status(url)
    assert sent == ["Bearer sk-right", "Bearer sk-wrong", None]
    assert wrong.route == missing.route == "error" and wrong.http_status == 401
    assert "requires its API key; the key sent was refused" in fix_case(["matmul_lora"], wrong).diagnosis
    assert "requires its API key; no key was sent" in fix_case(["matmul_lora"], missing).diagnosis
    assert "sk-wrong" not in wrong.detail
