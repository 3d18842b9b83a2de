"""The canary without a server: its state machine, its rows, its metrics and its HTTP listener.

A fake runner stands in for `run_smoke` and a fake clock for time, so nothing here waits.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploykit.canary.config import CanaryOptions, build_config, config_for_profile
from deploykit.canary.listener import serve_http
from deploykit.canary.rotation import CANARY_LONG_PROMPT_TOKENS, case_labels, rotation_for, run_requests
from deploykit.canary.runner import Canary, CanaryConfig, RunSummary
from deploykit.canary.runtime import run_loop
from deploykit.canary.settings import SETTINGS, CanarySettings, parse_listen
from deploykit.canary.state import CanaryState, outcome_of
from deploykit.endpoint import Endpoint
from deploykit.profile.load import load_profile
from deploykit.profile.schema import Profile, SmokeCase
from deploykit.results.sql.store import open_store
from deploykit.smoke import LONG_PROMPT_TOKENS, CaseResult, SmokeReport, requests_for_profile, summarise
from tests.cli_process import run_python


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


NOW = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def make(tmp_path: Path, *reports: SmokeReport, **config: Any) -> tuple[Canary, Script, Clock]:
    script, clock = Script(*reports), Clock()
    cases = config.pop("cases", [SmokeCase(kind="completion"), SmokeCase(kind="repeat")])
    settings = {"every_s": 5, **{name: config.pop(name) for name in SETTINGS if name in config}}
    endpoint = Endpoint("http://127.0.0.1:1", config.pop("api_key", None))
    canary = Canary(
        CanaryConfig(
            endpoint=endpoint,
            served_name="tiny",
            cases=cases,
            settings=CanarySettings(**settings),
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


def _long_prompt_lengths(requests: list[Any]) -> list[int]:
    return [len(r.body["prompt"]) for r in requests if isinstance(r.body.get("prompt"), list)]


def test_the_long_case_is_bounded_by_what_it_detects_not_by_max_model_len() -> None:
    # qwen-lora-hopper serves 32k tokens; its rotation's long prompts stay at 512, a full rotation included.
    profile = load_profile("qwen-lora-hopper").profile
    assert profile.serve.max_model_len == 32768
    rotation = rotation_for(profile)
    lengths = [
        n
        for number in range(len(rotation))
        for n in _long_prompt_lengths(run_requests(rotation, number, "q", "a", profile.serve.max_model_len))
    ]
    assert (
        max(lengths) == CANARY_LONG_PROMPT_TOKENS == 512 and CANARY_LONG_PROMPT_TOKENS >= LONG_PROMPT_TOKENS
    )
    # A profile that asks for a full-context long case gets it in its start-up smoke, once per start; the
    # canary, which asks every minute for as long as the server serves, sends the bounded one.
    long = {"kind": "long_then_short", "prompt_tokens": 30000}
    cached = {"kind": "prefix_cache", "prompt_tokens": 30000}
    explicit = Profile.model_validate(
        {
            "name": "p",
            "model": {"source": "/models/m"},
            "serve": {"max_model_len": 32768},
            "smoke": {"cases": [long, cached]},
        }
    )
    assert max(_long_prompt_lengths(requests_for_profile(explicit))) == 30000
    rotation = rotation_for(explicit)
    for number in range(len(rotation)):
        requests = run_requests(rotation, number, "m", None, 32768)
        assert all(n <= CANARY_LONG_PROMPT_TOKENS for n in _long_prompt_lengths(requests)), number
    assert [c.prompt_tokens for c in rotation if c.kind in ("long_then_short", "prefix_cache")] == [512, 512]


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


# --- the verdict file (`--verdict-file`) -----------------------------------------------------------


def read_json(path: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def test_verdict_file_says_starting_then_each_runs_verdict_rewritten_every_run(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "verdict.json"
    path.parent.mkdir()
    canary, script, clock = make(tmp_path, GOOD, GOOD, WRONG, store=False, verdict_file=str(path))
    canary.config.settings = canary.config.settings.replace(every_s=0.1)  # runs at the shortest interval
    seen: list[dict[str, Any]] = []
    stop = threading.Event()

    def runner(endpoint: Endpoint, requests: Any, **kwargs: Any) -> SmokeReport:
        seen.append(read_json(path))  # what the file says before each run
        return script(endpoint, requests, **kwargs)

    def on_run(summary: RunSummary) -> None:
        clock.now += 5
        if summary.number == 2:
            stop.set()

    canary.runner, canary.on_run = runner, on_run
    run_loop(canary, stop)
    seen.append(read_json(path))
    assert [v["status"] for v in seen] == ["starting", "healthy", "healthy", "corrupt"]
    assert seen[0] == {
        "format": "deploykit-canary-verdict/1",
        "status": "starting",
        "diagnosis": "no run yet",
        "written_at": NOW,
        "pid": os.getpid(),
        "run_id": canary.run_id,
        "sequence": 1,
        "runs": 0,
        "final": False,
    }
    assert [v["sequence"] for v in seen] == [1, 2, 3, 4]  # which write of which run: a reader sees it advance
    assert [v["written_at"] for v in seen] == [NOW, NOW, NOW + 5, NOW + 10]  # rewritten, changed or not
    assert (
        seen[3]["diagnosis"].startswith("completion: ") and "every generated id is 0" in seen[3]["diagnosis"]
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in path.parent.iterdir()) == ["verdict.json"]  # no temporary file left


def test_verdict_file_on_a_server_restart(tmp_path: Path) -> None:
    path = tmp_path / "verdict.json"
    canary, _, _ = make(tmp_path, WRONG, store=False, verdict_file=str(path))
    canary.run_once()
    assert read_json(path)["status"] == "corrupt"
    assert canary.server_restarted() == "starting"
    found = read_json(path)
    assert found["status"] == "starting" and "the server restarted" in found["diagnosis"]


def test_verdict_file_is_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new verdict is complete and fsynced in another file of the same directory before it is renamed
    over the old one, which stays whole until then: a reader never sees part of a verdict."""
    path = tmp_path / "verdict.json"
    canary, _, _ = make(tmp_path, GOOD, store=False, verdict_file=str(path))
    canary.write_verdict()
    synced: list[int] = []
    replaced: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    def replace(source: Any, target: Any) -> None:
        assert synced, "renamed before fsync"
        assert Path(source).parent == path.parent and Path(source) != path
        assert read_json(Path(source))["status"] == "healthy"  # the new verdict, whole
        assert read_json(path)["status"] == "starting"  # the old one, untouched so far
        replaced.append((str(source), str(target)))
        real_replace(source, target)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    canary.run_once()
    assert len(replaced) == 1 and replaced[0][1] == str(path)
    assert read_json(path)["status"] == "healthy"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["verdict.json"]


@pytest.mark.parametrize("obstacle", ["path is a directory", "parent is a file", "no parent"])
def test_verdict_file_write_failure_is_a_warning_and_the_canary_goes_on(
    tmp_path: Path, obstacle: str
) -> None:
    shared = tmp_path / "shared"
    path = shared / "verdict.json"
    if obstacle == "path is a directory":
        path.mkdir(parents=True)
    elif obstacle == "parent is a file":
        shared.write_text("not a directory")
    canary, _, clock = make(tmp_path, GOOD, WRONG, GOOD, store=False, verdict_file=str(path))
    warnings: list[str] = []
    canary.on_warning = warnings.append
    canary.write_verdict()
    canary.run_once()
    assert canary.run_once().changed == "corrupt"  # the checking went on
    healthy, text = canary.health()
    assert not healthy and text.startswith("corrupt: repeat: ")
    assert len(warnings) == 1  # once per streak, not once per run
    assert warnings[0].startswith(f"the verdict file {path} could not be written (")
    assert warnings[0].endswith("); the canary goes on")
    assert not list(tmp_path.rglob(".verdict.json.*"))  # no temporary file left behind
    # the obstacle goes: the next run writes the file again, and says so
    if path.is_dir():
        path.rmdir()
    else:
        shared.unlink(missing_ok=True)
        shared.mkdir()
    clock.now += 5
    canary.run_once()
    assert warnings[1:] == [f"the verdict file {path} is written again"]
    assert read_json(path)["status"] == "corrupt" and read_json(path)["written_at"] == NOW + 5


def test_run_canary_warns_on_stderr_when_the_verdict_file_cannot_be_written(tmp_path: Path) -> None:
    """The command end to end against a stand-in server: its verdict write fails (the path is a directory),
    the warning goes to stderr, and the canary keeps running until it is stopped."""
    path = tmp_path / "verdict"
    path.mkdir()
    result = run_python(["-c", RUN_CANARY, str(path)], timeout=60)  # forked: tests/cli_process.py
    assert result.returncode == 0, result.stderr
    assert (
        f"deploykit canary: the verdict file {path} could not be written (refused: {path} is a directory"
        in result.stderr
    )
    assert "could not be written" not in result.stdout
    assert "run 2 completion: ok" in result.stdout  # still checking after the failed writes


# Runs `run_canary` in a child process (it installs signal handlers) with a fake runner, stopping it with
# SIGINT in the third run.
RUN_CANARY = """
import os, signal, sys
from deploykit.canary import command as module
from deploykit.canary.settings import CanarySettings
from deploykit.profile.schema import Profile, SmokeCase
from deploykit.smoke import CaseResult, summarise

good = summarise(
    [CaseResult(name="c", kind="completion", endpoint="/v1/completions", model="m", passed=True)]
)
runs = []

def runner(endpoint, requests, **kwargs):
    runs.append(1)
    if len(runs) == 3:  # mid-run: this run is abandoned, not judged
        os.kill(os.getpid(), signal.SIGINT)
    return good

real_canary = module.Canary
module.Canary = lambda config, **kw: real_canary(config, runner=runner, **kw)
from deploykit.endpoint import Endpoint
module.build_config = lambda options: module.CanaryConfig(
    endpoint=Endpoint(options.url), served_name="m", cases=[SmokeCase(kind="completion")],
    settings=options.settings.replace(every_s=0.1), store=False,
    verdict_file=options.verdict_file,
)
options = module.CanaryOptions(
    url="http://127.0.0.1:1", settings=CanarySettings(listen="127.0.0.1:0"), store=False,
    watch_restarts=False, verdict_file=sys.argv[1],
)
sys.exit(module.run_canary(options))
"""


def test_the_cli_passes_verdict_file_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from deploykit.cli import app

    got: list[CanaryOptions] = []

    def fake_run_canary(options: CanaryOptions, *args: Any) -> int:
        got.append(options)
        return 0

    monkeypatch.setattr("deploykit.canary.command.run_canary", fake_run_canary)
    argv = ["canary", "--url", "http://127.0.0.1:8000", "--verdict-file", "/run/deploykit/verdict.json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert got[0].verdict_file == "/run/deploykit/verdict.json"
    assert CliRunner().invoke(app, ["canary", "--url", "http://x"]).exit_code == 0
    assert got[1].verdict_file is None


def test_build_config_carries_the_verdict_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("deploykit.canary.discovery.discover_model", lambda endpoint, wanted: ("tiny", 2048))
    config = build_config(CanaryOptions(url="http://127.0.0.1:1", verdict_file="/run/v.json"))
    assert config.verdict_file == "/run/v.json"
    profile = load_profile("demo-cpu").profile
    made = config_for_profile(profile, None, endpoint=Endpoint("u"), model_path=None, verdict_file="/v")
    assert made.verdict_file == "/v"
