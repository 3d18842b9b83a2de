"""The canary without a server: its state machine, its rows, its metrics and its HTTP listener.

A fake runner stands in for `run_smoke` and a fake clock for time, so nothing here waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploykit.profile.load import load_profile
from deploykit.profile.schema import SmokeCase
from deploykit.serve.canary import (
    Canary,
    CanaryConfig,
    CanaryState,
    case_labels,
    outcome_of,
    parse_listen,
    rotation_for,
    serve_http,
)
from deploykit.smoke import CaseResult, SmokeReport, summarise
from deploykit.store import open_store


def case(passed: bool = True, miss: bool = False, diagnosis: str = "", warning: str = "") -> CaseResult:
    return CaseResult(
        name="c",
        kind="completion",
        endpoint="/v1/completions",
        model="m",
        passed=passed,
        miss=miss,
        diagnosis=diagnosis,
        warning=warning,
        completion_tokens=8,
        prompt_tokens=6,
    )


GOOD = summarise([case()])
WRONG = summarise([case(False, diagnosis="every generated id is 0 or a special/pad token")])
MISS = summarise([case(False, miss=True, diagnosis="timeout: no answer within 5 s")])


class Script:
    """A runner that answers with the next report of a script, and records what it was asked."""

    def __init__(self, *reports: SmokeReport) -> None:
        self.reports = list(reports)
        self.calls: list[list[str]] = []

    def __call__(self, url: str, requests: Any, **kwargs: Any) -> SmokeReport:
        self.calls.append([r.name for r in requests])
        return self.reports.pop(0)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, *reports: SmokeReport, **config: Any) -> tuple[Canary, Script, Clock]:
    script, clock = Script(*reports), Clock()
    cases = config.pop("cases", [SmokeCase(kind="completion"), SmokeCase(kind="repeat")])
    canary = Canary(
        CanaryConfig(
            url="http://127.0.0.1:1",
            served_name="tiny",
            cases=cases,
            every_s=5,
            store_url=f"sqlite:///{tmp_path / 'results.sqlite'}",
            **config,
        ),
        clock=clock,
        runner=script,
    )
    return canary, script, clock


def stored(tmp_path: Path) -> list[Any]:
    store = open_store(f"sqlite:///{tmp_path / 'results.sqlite'}")
    try:
        return list(reversed(store.recent(limit=100)))
    finally:
        store.close()


def test_outcome_wrong_beats_miss() -> None:
    assert outcome_of(GOOD) == "pass"
    assert outcome_of(WRONG) == "wrong" and outcome_of(MISS) == "miss"
    assert outcome_of(summarise([case(False, miss=True), case(False)])) == "wrong"
    assert outcome_of(summarise([case(warning="near tie")])) == "pass"
    assert outcome_of(SmokeReport(passed=False, diagnosis="none", cases=[])) == "wrong"


def test_state_wrong_at_once_misses_only_after_the_limit_recovery_after_a_rotation() -> None:
    state = CanaryState(rotation_len=3, miss_limit=3)
    assert state.healthy and state.status == "starting"
    assert state.observe("completion", "pass", "ok") == "healthy"
    assert state.observe("repeat", "miss", "timeout") is None
    assert state.observe("batch", "miss", "timeout") is None and state.healthy
    assert state.observe("completion", "miss", "timeout") == "unreachable" and not state.healthy
    assert "3 runs in a row got no answer" in state.diagnosis
    assert state.observe("completion", "pass", "ok") == "healthy"
    assert state.observe("repeat", "wrong", "NaN") == "corrupt" and not state.healthy
    assert state.diagnosis == "repeat: NaN"
    for _ in range(5):  # misses while corrupt never hide the corruption
        assert state.observe("batch", "miss", "timeout") is None
    assert state.status == "corrupt"
    assert state.observe("a", "pass", "ok") is None and state.observe("b", "pass", "ok") is None
    assert state.observe("c", "pass", "ok") == "healthy"  # a whole rotation passed in a row


def test_rotation_is_cheap_and_covers_every_consistency_kind() -> None:
    rotation = rotation_for(load_profile("demo-cpu").profile)
    kinds = [c.kind for c in rotation]
    assert kinds == ["completion", "chat", "repeat", "long_then_short", "prefix_cache", "batch"]
    assert all(c.max_tokens <= 8 for c in rotation)
    assert rotation[3].prompt_tokens == 512 and rotation[5].batch_size == 4
    assert [c.kind for c in rotation_for(None)] == [
        "completion",
        "repeat",
        "long_then_short",
        "prefix_cache",
        "batch",
    ]
    assert case_labels([SmokeCase(kind="repeat"), SmokeCase(kind="repeat")]) == ["repeat", "repeat#2"]


def test_each_run_checks_the_next_case_with_fresh_long_prompts(tmp_path: Path) -> None:
    cases = [SmokeCase(kind="completion"), SmokeCase(kind="long_then_short", prompt_tokens=30)]
    canary, script, _ = make(tmp_path, GOOD, GOOD, GOOD, GOOD, cases=cases)
    for _ in range(4):
        canary.run_once()
    assert script.calls[0] == ["completion"] and script.calls[2] == ["completion"]
    assert script.calls[1] == ["long_then_short:short", "long_then_short:long", "long_then_short:again"]
    first, second = canary.requests_for_run(1)[1][1], canary.requests_for_run(3)[1][1]
    assert first.body["prompt"] != second.body["prompt"]  # no prefix-cache hit on the previous run's prompt


def test_rows_on_state_change_and_hourly_heartbeat_never_per_run(tmp_path: Path) -> None:
    reports = [GOOD] * 10 + [WRONG] + [WRONG] * 3 + [GOOD, GOOD]
    canary, _, clock = make(tmp_path, *reports)
    for _ in range(10):
        canary.run_once()
        clock.now += 60
    assert [r.stage for r in stored(tmp_path)] == ["state:healthy"]  # the first verdict, then nothing
    clock.now += 3600  # an hour since the last row
    canary.run_once()  # the WRONG run: a state change
    for _ in range(3):
        canary.run_once()
    rows = stored(tmp_path)
    assert [(r.stage, r.verdict) for r in rows] == [("state:healthy", "pass"), ("state:corrupt", "fail")]
    assert rows[1].command == "canary" and "every generated id is 0" in rows[1].diagnosis
    assert rows[1].cases and not rows[1].cases[0].passed
    clock.now += 3600
    canary.run_once()  # still corrupt after one pass (rotation of 2): a heartbeat
    canary.run_once()  # healthy again
    assert [r.stage for r in stored(tmp_path)] == [
        "state:healthy",
        "state:corrupt",
        "heartbeat",
        "state:healthy",
    ]
    assert canary.runs == 16


def test_metrics_text(tmp_path: Path) -> None:
    canary, _, clock = make(tmp_path, GOOD, MISS, summarise([case(warning="near tie")]), WRONG, store=False)
    for _ in range(4):
        canary.run_once()
        clock.now += 5
    text = canary.metrics.text().decode()
    assert "deploykit_canary_healthy 0.0" in text
    assert 'deploykit_canary_runs_total{case="completion"} 2.0' in text
    assert 'deploykit_canary_failures_total{case="repeat",reason="miss"} 1.0' in text
    assert 'deploykit_canary_failures_total{case="repeat",reason="wrong"} 1.0' in text
    assert 'deploykit_canary_warnings_total{case="completion"} 1.0' in text
    values = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
    assert float(values["deploykit_canary_last_pass_timestamp_seconds"]) == 1_800_000_010.0
    assert "deploykit_canary_requests_total 4.0" in text
    assert "deploykit_canary_generated_tokens_total 32.0" in text
    assert not (tmp_path / "results.sqlite").exists()  # --no-store: not even opened


@pytest.fixture
def listener(tmp_path: Path) -> Iterator[tuple[Canary, str]]:
    canary, _, _ = make(tmp_path, GOOD, WRONG, store=False)
    server = serve_http(canary, "127.0.0.1", 0)
    try:
        yield canary, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_healthz_and_metrics_over_http(listener: tuple[Canary, str]) -> None:
    canary, base = listener
    assert httpx.get(base + "/healthz").status_code == 200  # starting: not known to be wrong
    canary.run_once()
    ok = httpx.get(base + "/healthz")
    assert ok.status_code == 200 and ok.text.startswith("healthy: completion")
    canary.run_once()
    bad = httpx.get(base + "/healthz")
    assert bad.status_code == 503 and bad.text.startswith("corrupt: repeat:")
    metrics = httpx.get(base + "/metrics")
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    assert "deploykit_canary_healthy 0.0" in metrics.text
    assert httpx.get(base + "/nope").status_code == 404


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9400") == ("127.0.0.1", 9400)
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    assert parse_listen("[::1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen("9400")
