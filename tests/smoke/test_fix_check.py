"""Smoke's fix check, client side: --expect-fixes parsing, the status route read, the diagnosis."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from deploykit.endpoint import Endpoint
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
        status = read_status(Endpoint(url + "/"))
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
        status = read_status(Endpoint(url))
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
        status = read_status(Endpoint(url))
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
    status = read_status(Endpoint(url))
    assert status.route == "error" and status.fixes_active is None
    assert "could not be read: ConnectionRefusedError" in fix_case(["matmul_lora"], status).diagnosis


def test_the_key_is_sent_and_a_refusal_says_why() -> None:
    def answer(auth: str | None) -> tuple[int, Any]:
        if auth == "Bearer sk-right":
            return 200, {"fixes_requested": ["matmul_lora"], "fixes_active": {"matmul_lora": "T"}}
        return 401, {"error": "Unauthorized"}

    with _server(answer) as (url, sent):
        assert read_status(Endpoint(url, api_key="sk-right")).fixes_active == {"matmul_lora": "T"}
        wrong = read_status(Endpoint(url, api_key="sk-wrong"))
        missing = read_status(Endpoint(url))
    assert sent == ["Bearer sk-right", "Bearer sk-wrong", None]
    assert wrong.route == missing.route == "error" and wrong.http_status == 401
    assert "requires its API key; the key sent was refused" in fix_case(["matmul_lora"], wrong).diagnosis
    assert "requires its API key; no key was sent" in fix_case(["matmul_lora"], missing).diagnosis
    assert "sk-wrong" not in wrong.detail


# --- every rank: tensor / pipeline parallel ranks, across nodes -------------------------------------------

FIXES = ["matmul_lora", "device_penalties"]
TARGETS = {"matmul_lora": "PunicaWrapperCPU.add_lora_linear", "device_penalties": "InputBatch.no_penalties"}


def _rank(rank: int, node: int, applied: list[str], requested: list[str] | None = None) -> dict[str, Any]:
    """One rank's record as the plugin answers it (TP 2 over two nodes: rank r is tp r, node r)."""
    return {
        "pid": 100 + rank,
        "rank": rank,
        "local_rank": 0,
        "tp_rank": rank,
        "pp_rank": 0,
        "node_rank": node,
        "hostname": f"node-{node}",
        "fixes_requested": FIXES if requested is None else requested,
        "fixes_applied": {name: TARGETS[name] for name in applied},
    }


def _status_body(engine: list[dict[str, Any]], *, world_size: int = 2, active: list[str]) -> dict[str, Any]:
    return {
        "fixes_requested": FIXES,
        "fixes_active": {name: TARGETS[name] for name in active},
        "engine": engine,
        "engine_error": None,
        "world": {"size": world_size, "tensor_parallel_size": world_size, "pipeline_parallel_size": 1},
    }


def _read(body: dict[str, Any]) -> ServerFixStatus:
    with _server(lambda _: (200, body)) as (url, _):
        return read_status(Endpoint(url))


def test_a_rank_that_did_not_apply_a_fix_is_named_with_its_place_and_its_environment() -> None:
    # Node 1 was started with another DEPLOYKIT_FIXES. The server's fixes_active even claims matmul_lora (as a
    # server that judged by fewer records might): the ranks' own answers decide.
    engine = [_rank(0, 0, FIXES), _rank(1, 1, ["device_penalties"], requested=["device_penalties"])]
    status = _read(_status_body(engine, active=FIXES))
    assert status.world_size == 2 and status.ranks is not None and len(status.ranks) == 2
    case = fix_case(FIXES, status)
    assert not case.passed
    assert (
        "matmul_lora: requested, but rank 1 (tp 1, pp 0, node 1, host node-1) did not apply it "
        "(its DEPLOYKIT_FIXES is device_penalties)" in case.diagnosis
    )
    assert "device_penalties:" not in case.diagnosis and "rank 0" not in case.diagnosis
    assert fix_case(["device_penalties"], status).passed  # every rank applied that one


def test_fewer_ranks_than_the_world_fail_naming_the_silent_ones() -> None:
    # fixes_active lists the fix, as a route that judged by the answers alone did (deploykit before issue 44).
    engine = [_rank(0, 0, FIXES), _rank(2, 1, FIXES)]
    status = _read(_status_body(engine, world_size=4, active=["device_penalties"]))
    case = fix_case(["device_penalties"], status)
    assert not case.passed
    assert (
        "device_penalties: requested, but only 2 of the engine's 4 ranks answered (no answer from ranks 1, 3)"
        in case.diagnosis
    )


def test_every_rank_with_every_fix_passes() -> None:
    status = _read(_status_body([_rank(0, 0, FIXES), _rank(1, 1, FIXES)], active=FIXES))
    case = fix_case(FIXES, status)
    assert case.passed and case.diagnosis == ""
    assert (
        case.text
        == "matmul_lora → PunicaWrapperCPU.add_lora_linear, device_penalties → InputBatch.no_penalties"
    )


def test_an_older_servers_answer_without_ranks_or_world_is_judged_by_fixes_active() -> None:
    old = {"pid": 7, "rank": 0, "fixes_applied": {"device_penalties": "T"}}  # deploykit before issue 44
    body = {
        "fixes_requested": ["device_penalties"],
        "fixes_active": {"device_penalties": "T"},
        "engine": [old],
    }
    status = _read(body)
    assert status.world_size is None and status.ranks_problem is None
    assert status.ranks is not None and status.ranks[0].label() == "rank 0"
    assert fix_case(["device_penalties"], status).passed


@pytest.mark.parametrize(
    ("engine", "world", "words"),
    [
        (
            [{"pid": 1, "rank": "1", "fixes_applied": {}}],
            None,
            "engine.0.rank: Input should be a valid integer",
        ),
        (
            [{"pid": 1, "rank": True, "fixes_applied": {}}],
            None,
            "engine.0.rank: Input should be a valid integer",
        ),
        ("everything", None, "engine: Input should be a valid list"),
        ([], {"size": 0}, "world.size: Input should be greater than or equal to 1"),
        (
            [],
            {"size": 10**12},
            "world.size: Input should be less than or equal to 65536",
        ),  # no huge rank list
    ],
)
def test_a_malformed_per_rank_answer_fails_the_check_closed(engine: Any, world: Any, words: str) -> None:
    body = {
        "fixes_requested": ["device_penalties"],
        "fixes_active": {"device_penalties": "T"},
        "engine": engine,
    }
    status = _read({**body, "world": world})
    diagnosis = fix_case(["device_penalties"], status).diagnosis
    assert f"device_penalties: requested, but the server's per-rank answer is malformed: {words}" in diagnosis


def test_a_rank_without_the_status_method_is_explained() -> None:
    # vLLM's words when one rank's process has no deploykit_status (its node started without DEPLOYKIT_FIXES).
    error = "RuntimeError: Worker failed with error ''CPUWorker' object has no attribute 'deploykit_status''"
    status = ServerFixStatus(route="ok", fixes_requested=["matmul_lora"], fixes_active={}, engine_error=error)
    diagnosis = fix_case(["matmul_lora"], status).diagnosis
    assert "requested, but the engine did not answer: RuntimeError" in diagnosis
    assert "every node needs deploykit installed and DEPLOYKIT_FIXES set" in diagnosis


def test_a_large_world_lacking_a_fix_everywhere_is_one_bounded_line() -> None:
    engine = [_rank(r, r // 8, []) for r in range(16)]
    status = _read(_status_body(engine, world_size=16, active=[]))
    diagnosis = fix_case(["matmul_lora"], status).diagnosis
    assert diagnosis.count("did not apply it") == 4 and "and 12 more rank(s) did not either" in diagnosis
