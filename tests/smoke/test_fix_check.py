"""Smoke's fix check, client side: --expect-fixes parsing, the status route read, the diagnosis."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from deploykit.smoke.fix_check import (
    PLUGIN_NOT_LOADED,
    ServerFixStatus,
    fix_case,
    parse_expect_fixes,
    read_status,
)

KNOWN = ("fp32_projection", "matmul_lora", "device_penalties")


def test_parse_expect_fixes() -> None:
    assert parse_expect_fixes("device_penalties, fp32_projection,device_penalties", KNOWN) == [
        "device_penalties",
        "fp32_projection",
    ]
    assert parse_expect_fixes("none", KNOWN) == [] and parse_expect_fixes("", KNOWN) == []
    with pytest.raises(ValueError, match=r"unknown fix\(es\) fp16.*known fixes: fp32_projection"):
        parse_expect_fixes("fp16", KNOWN)


def _answer(monkeypatch: pytest.MonkeyPatch, status: int, body: Any) -> None:
    def get(url: str, **_: Any) -> httpx.Response:
        assert url == "http://server:8000/deploykit/status"
        return httpx.Response(status, json=body, request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", get)


def test_a_missing_route_means_the_plugin_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(monkeypatch, 404, {"detail": "Not Found"})
    status = read_status("http://server:8000/")
    assert status.route == "missing" and status.fixes_active == {}
    case = fix_case(["device_penalties", "fp32_projection"], status)
    assert not case.passed
    assert "device_penalties: " + PLUGIN_NOT_LOADED in case.diagnosis
    assert "fp32_projection: " + PLUGIN_NOT_LOADED in case.diagnosis


def test_active_fixes_pass_and_missing_ones_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _answer(
        monkeypatch,
        200,
        {
            "fixes_requested": ["device_penalties"],
            "fixes_active": {"device_penalties": "T"},
            "engine_error": None,
        },
    )
    status = read_status("http://server:8000")
    assert status.fixes_active == {"device_penalties": "T"}
    assert fix_case(["device_penalties"], status).passed
    case = fix_case(["device_penalties", "fp32_projection"], status)
    assert (
        not case.passed
        and "fp32_projection: not requested: the server's DEPLOYKIT_FIXES is device_penalties"
        in case.diagnosis
    )
    assert "device_penalties:" not in case.diagnosis


def test_requested_but_not_applied_by_the_engine() -> None:
    status = ServerFixStatus(
        route="ok", fixes_requested=["matmul_lora"], fixes_active={}, engine_error="boom"
    )
    assert (
        "matmul_lora: requested, but the engine did not answer: boom"
        in fix_case(["matmul_lora"], status).diagnosis
    )


def test_an_unreachable_server_is_an_error_not_a_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(url: str, **_: Any) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(httpx, "get", refuse)
    status = read_status("http://server:8000")
    assert status.route == "error" and status.fixes_active is None
    assert "could not be read: ConnectError" in fix_case(["matmul_lora"], status).diagnosis


def test_the_key_is_sent_and_a_refusal_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[dict[str, str]] = []

    def get(url: str, *, headers: dict[str, str], **_: Any) -> httpx.Response:
        sent.append(headers)
        ok = headers.get("Authorization") == "Bearer sk-right"
        body = {"fixes_requested": ["matmul_lora"], "fixes_active": {"matmul_lora": "T"}}
        return httpx.Response(
            200 if ok else 401,
            json=body if ok else {"error": "Unauthorized"},
            request=httpx.Request("GET", url),
        )

    monkeypatch.setattr(httpx, "get", get)
    assert read_status("http://server:8000", api_key="sk-right").fixes_active == {"matmul_lora": "T"}
    wrong = read_status("http://server:8000", api_key="sk-wrong")
    missing = read_status("http://server:8000")
    assert [h.get("Authorization") for h in sent] == ["Bearer sk-right", "Bearer sk-wrong", None]
    assert wrong.route == missing.route == "error" and wrong.http_status == 401
    assert "requires its API key; the key sent was refused" in fix_case(["matmul_lora"], wrong).diagnosis
    assert "requires its API key; no key was sent" in fix_case(["matmul_lora"], missing).diagnosis
    assert "sk-wrong" not in wrong.detail
