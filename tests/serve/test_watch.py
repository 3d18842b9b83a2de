"""Serving mode's corruption handling without vLLM: the restart budget, the canary's verdict as serve sees
it (wrong answers only; misses never), `/livez`, a restarted server, and the serving loop's decisions with
a fake server and a fake canary (tests/e2e/test_serve_canary_e2e.py does it for real)."""

from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploykit import exit_codes
from deploykit.canary.config import config_for_profile
from deploykit.canary.listener import serve_http
from deploykit.canary.runtime import CanaryRuntime
from deploykit.canary.settings import CanarySettings
from deploykit.canary.state import CanaryState
from deploykit.endpoint import Endpoint
from deploykit.profile.load import load_profile
from deploykit.results.sql.store import open_store
from deploykit.serve import watch
from deploykit.serve.console import ConsoleUI
from deploykit.serve.options import ServeOptions
from deploykit.serve.signals import SignalGate
from deploykit.serve.stages import Attempt
from deploykit.serve.watch import CanaryWatch, RestartBudget
from tests.canary.test_canary import GOOD, MISS, WRONG, make, stored

FACTS = Path(__file__).resolve().parents[1] / "fixtures" / "facts"

# --- the budget ------------------------------------------------------------------------------------


def test_restart_budget_backs_off_and_caps_per_hour() -> None:
    budget = RestartBudget(max_per_hour=3, backoff_s=10)
    assert budget.next_delay(0) == 0.0  # the first restart in an hour: at once
    assert budget.record(0) == 1
    assert budget.next_delay(100) == 10.0
    budget.record(110)
    assert budget.next_delay(200) == 20.0
    budget.record(220)
    assert budget.next_delay(300) is None  # the cap: the next corruption stops serving
    assert budget.next_delay(3600 + 1) == 20.0  # the first one is an hour old: two left in the hour
    assert budget.record(3601) == 3


def test_restart_budget_zero_means_never() -> None:
    assert RestartBudget(max_per_hour=0).next_delay(0) is None


def test_backoff_has_a_ceiling() -> None:
    budget = RestartBudget(max_per_hour=100, backoff_s=60, max_backoff_s=300)
    for at in range(20):
        budget.record(at)
    assert budget.next_delay(30) == 300


# --- what serve hears from the canary ---------------------------------------------------------------


def test_only_wrong_answers_signal_corruption(tmp_path: Path) -> None:
    canary, _, _ = make(tmp_path, GOOD, MISS, MISS, MISS, MISS, MISS, MISS, WRONG, store=False)
    watched = CanaryWatch(canary, ConsoleUI(quiet=True), http=False)
    for _ in range(7):  # a pass, then six misses: unreachable, never corruption
        canary.run_once()
        assert not watched.corrupt.is_set()
    assert canary.state.status == "unreachable"
    canary.run_once()
    assert watched.corrupt.is_set() and canary.state.status == "corrupt"


def test_a_hung_engine_signals_like_corruption_and_a_restart_clears_it(tmp_path: Path) -> None:
    """serve acts on `hung` as on corruption (same event, same restart budget); the row says which."""
    from deploykit.canary.progress import ProgressReading

    canary, _, _ = make(tmp_path, GOOD, store=False)
    canary.config.hung_after_s = 60.0
    watched = CanaryWatch(canary, ConsoleUI(quiet=True), http=False)
    canary.observe_progress(ProgressReading(tokens=3, queued=1), now=0.0)
    assert not watched.corrupt.is_set()
    canary.observe_progress(ProgressReading(tokens=3, queued=1), now=61.0)
    assert watched.corrupt.is_set()
    assert watched.problem().startswith("engine hung: hung: the engine is hung: requests have waited 61 s")
    watched.pause()
    canary.config.settings = canary.config.settings.replace(every_s=3600.0)  # one run at most while started
    watched.start(restarted=True)  # after serve restarted vLLM: the hang was the old engine's
    try:
        assert canary.state.status in ("starting", "healthy") and not watched.corrupt.is_set()
        assert canary.metrics.server_restarts._value.get() == 1
    finally:
        watched.close()


def test_serve_passes_the_profiles_tolerances_to_its_canary() -> None:
    loaded = load_profile("demo-cpu")
    profile = loaded.profile.model_copy(
        update={
            "smoke": loaded.profile.smoke.model_copy(update={"tie_tolerance": 0.5, "logprob_tolerance": 0.25})
        }
    )
    settings = CanarySettings(every_s=2)
    config = config_for_profile(
        profile, loaded.id, endpoint=Endpoint("http://127.0.0.1:1"), model_path=None, settings=settings
    )
    assert (config.tie_tolerance, config.logprob_tolerance, config.settings.every_s) == (0.5, 0.25, 2)
    assert [c.kind for c in config.cases][-4:] == ["repeat", "long_then_short", "prefix_cache", "batch"]


# --- a restarted server, /livez ---------------------------------------------------------------------


def test_state_starts_afresh_after_a_restart_only_when_it_was_bad() -> None:
    state = CanaryState(rotation_len=3)
    assert state.restarted() is None  # starting
    state.observe("a", "pass", "ok")
    assert state.restarted() is None and state.status == "healthy"
    state.observe("a", "wrong", "NaN")
    assert state.restarted() == "starting" and state.healthy and state.passes_since_wrong == 0
    assert "restarted" in state.diagnosis


def test_server_restarted_stores_a_row(tmp_path: Path) -> None:
    canary, _, _ = make(tmp_path, GOOD, WRONG)
    canary.run_once()
    canary.run_once()
    assert canary.server_restarted() == "starting"
    assert canary.metrics.healthy._value.get() == 1
    assert [r.stage for r in stored(tmp_path)] == ["state:healthy", "state:corrupt", "state:starting"]


def test_livez_fails_on_corruption_or_a_dead_server_never_on_misses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    up = {"ok": True}
    monkeypatch.setattr("deploykit.canary.discovery.server_health_ok", lambda endpoint, timeout: up["ok"])
    canary, _, _ = make(tmp_path, GOOD, *[MISS] * 6, WRONG, store=False)
    server = serve_http(canary, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert httpx.get(base + "/livez").status_code == 200  # before the first run
        for _ in range(7):
            canary.run_once()
        assert httpx.get(base + "/healthz").status_code == 503  # unreachable: out of the Service
        assert httpx.get(base + "/livez").status_code == 200  # but no restart for being busy
        up["ok"] = False
        dead = httpx.get(base + "/livez")
        assert dead.status_code == 503 and "/health" in dead.text
        up["ok"] = True
        canary.run_once()
        wrong = httpx.get(base + "/livez")
        assert wrong.status_code == 503 and wrong.text.startswith("corrupt: ")
    finally:
        server.shutdown()
        server.server_close()


def test_watch_restarts_resets_when_health_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answers = iter([True, False, False, True])
    stop = threading.Event()

    def health(endpoint: Endpoint, timeout: float) -> bool:
        try:
            return next(answers)
        except StopIteration:
            stop.set()
            return True

    monkeypatch.setattr("deploykit.canary.discovery.server_health_ok", health)
    canary, _, _ = make(tmp_path, WRONG, store=False)
    canary.run_once()
    runtime = CanaryRuntime(canary, watch_restarts=True, restart_poll_s=0, stop=stop)
    runtime._watch_restarts(stop)  # (in this thread: the answers above end it)
    assert canary.state.status == "starting"
    assert canary.metrics.server_restarts._value.get() == 1  # counted, for the restart-cap alert


# --- the serving loop's decisions -------------------------------------------------------------------


@dataclass
class FakeServer:
    log_path: Path
    pid: int = 4242
    stopped: int = 0
    code: int | None = None

    def exit_code(self) -> int | None:
        return self.code

    def stop(self, grace_s: float = 15.0) -> int | None:
        self.stopped += 1
        return 0

    def log_tail(self, max_lines: int = 40) -> str:
        return "log line"


@dataclass
class FakeWatch:
    """Reports corruption `corruptions` times (once per start), then nothing."""

    corruptions: int
    corrupt: threading.Event = field(default_factory=threading.Event)
    starts: int = 0
    closed: bool = False

    @property
    def canary(self) -> Any:
        return self

    def health(self) -> tuple[bool, str]:
        return False, "corrupt: repeat: every generated id is 0"

    def problem(self) -> str:
        return f"output corrupt: {self.health()[1]}"

    def start(self, restarted: bool = False) -> None:
        self.starts += 1
        if self.starts <= self.corruptions:
            self.corrupt.set()

    def pause(self) -> None:
        self.corrupt.clear()

    def close(self) -> None:
        self.closed = True


def serving(tmp_path: Path, **options: Any) -> tuple[Attempt, str]:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    loaded = load_profile("demo-cpu")
    attempt = Attempt(
        options=ServeOptions(
            profile="demo-cpu", store_url=store_url, canary=CanarySettings(every_s=1), **options
        ),
        loaded=loaded,
        base_url="http://127.0.0.1:1",
        versions={"deploykit": "test"},
    )
    attempt.server = FakeServer(tmp_path / "vllm.log")  # type: ignore[assignment]
    return attempt, store_url


def rows(url: str) -> list[tuple[str, str, str]]:
    store = open_store(url)
    try:
        return [(r.command, r.stage, r.diagnosis) for r in reversed(store.recent(limit=100))]
    finally:
        store.close()


def test_stop_on_corruption(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeWatch(corruptions=1)
    monkeypatch.setattr(watch, "start_watch", lambda attempt, ui: fake)
    attempt, url = serving(tmp_path, on_corruption="stop")
    server = attempt.server
    assert (
        watch.serve_foreground(attempt, SignalGate(armed=False), ConsoleUI(quiet=True)) == exit_codes.FAILED
    )
    assert server.stopped == 1 and fake.closed  # type: ignore[union-attr]
    ((command, stage, diagnosis),) = rows(url)
    assert (command, stage) == ("serve", "corruption") and "--on-corruption stop" in diagnosis


def test_restart_then_cap_then_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeWatch(corruptions=2)
    monkeypatch.setattr(watch, "start_watch", lambda attempt, ui: fake)
    relaunched: list[int] = []

    def relaunch(previous: Attempt, number: int, ui: ConsoleUI, gate: SignalGate) -> tuple[Attempt, bool]:
        relaunched.append(number)
        fresh = Attempt(options=previous.options, loaded=previous.loaded, base_url=previous.base_url)
        fresh.server = FakeServer(tmp_path / f"vllm{number}.log")  # type: ignore[assignment]
        return fresh, True

    monkeypatch.setattr(watch, "_relaunch", relaunch)
    attempt, url = serving(tmp_path, on_corruption="restart", max_restarts_per_hour=1)
    first = attempt.server
    assert (
        watch.serve_foreground(attempt, SignalGate(armed=False), ConsoleUI(quiet=True)) == exit_codes.FAILED
    )
    assert relaunched == [1] and first.stopped == 1  # type: ignore[union-attr]
    assert fake.starts == 2  # resumed after the restart
    decisions = [d for _, stage, d in rows(url) if stage == "corruption"]
    assert len(decisions) == 2
    assert "restarting it after 0 s (restart 1 of at most 1 in an hour)" in decisions[0]
    assert "1 restart(s) in the last hour already, the cap" in decisions[1]


def test_a_failed_smoke_after_the_restart_counts_as_corruption(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeWatch(corruptions=1)
    monkeypatch.setattr(watch, "start_watch", lambda attempt, ui: fake)

    def relaunch(previous: Attempt, number: int, ui: ConsoleUI, gate: SignalGate) -> tuple[Attempt, bool]:
        fresh = Attempt(options=previous.options, loaded=previous.loaded, base_url=previous.base_url)
        fresh.server = FakeServer(tmp_path / "again.log")  # type: ignore[assignment]
        return fresh, False

    monkeypatch.setattr(watch, "_relaunch", relaunch)
    attempt, url = serving(tmp_path, max_restarts_per_hour=1)
    assert (
        watch.serve_foreground(attempt, SignalGate(armed=False), ConsoleUI(quiet=True)) == exit_codes.FAILED
    )
    assert [stage for _, stage, _ in rows(url)] == ["corruption", "corruption"]


def test_ignore_keeps_serving_until_a_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeWatch(corruptions=1)
    monkeypatch.setattr(watch, "start_watch", lambda attempt, ui: fake)
    attempt, url = serving(tmp_path, on_corruption="ignore")
    gate = SignalGate(armed=False)
    said: list[str] = []

    class UI(ConsoleUI):
        def warn(self, message: str) -> None:
            said.append(message)
            gate.received = signal.SIGTERM  # after the warning, stop

    assert watch.serve_foreground(attempt, gate, UI(quiet=True)) == exit_codes.OK
    assert any("serving on (--on-corruption ignore)" in m for m in said)
    assert rows(url) == []  # serve stores nothing for ignore; the canary's own row says it


def test_a_restart_binds_the_host_of_the_argv_also_on_ipv6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An IPv6 server's URL is `http://[::1]:PORT`; a restart must bind `::1`, as the first launch did."""
    from deploykit.plan import make_plan
    from deploykit.probe.load import load_facts
    from deploykit.serve import launch

    bound: list[tuple[str, int]] = []

    def start_server(argv: list[str], env: dict[str, str], *, log_path: Path, host: str, port: int) -> Any:
        bound.append((host, port))
        raise launch.LaunchError("refused by the test")

    monkeypatch.setattr(launch, "start_server", start_server)
    previous, url = serving(tmp_path)
    assert previous.loaded is not None
    previous.plan = make_plan(previous.loaded, load_facts(str(FACTS / "no-gpu.json")))
    values = {"--host": "::1", "--port": "18123"}
    argv = previous.plan.argv
    previous.argv = [values.get(argv[i - 1], arg) if i else arg for i, arg in enumerate(argv)]
    assert "::1" in previous.argv and "18123" in previous.argv
    previous.base_url = "http://[::1]:18123"
    restarted, passed = watch._relaunch(previous, 1, ConsoleUI(quiet=True), SignalGate(armed=False))
    assert bound == [("::1", 18123)]
    assert not passed and restarted.server is None
    assert rows(url)[-1][1] == "launch"
