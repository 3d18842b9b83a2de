"""`deploykit serve` in serving mode with its in-process canary, on the test-only fault worker (three vLLM
starts: the first, the restart after the corruption, the restart after the hang).

The demo profile with `--worker-cls tests.e2e.fault_worker.FaultWorker` and its length trigger off: healthy
until the test sends one request marked `deploykit_test_fault`, after which every forward pass returns NaN
for good (HTTP 200, `/health` 200). Serve runs the canary every 2 s with `/healthz` on a port of its own.
First, no false alarm: 8 concurrent completion streams for DEPLOYKIT_TEST_SERVE_CANARY_LOAD_S seconds (60
by default) while the canary runs, and not one canary failure, restart or extra row. Then the corruption
must be caught by the next canary run, `/healthz` must turn 503, serve must restart vLLM (a fresh worker:
healthy again), the restarted server's smoke must pass, the canary must turn healthy again, and the rows
must tell that story in order. Last, the hung engine (issue 31): one request marked to block the forward
pass for good (`/health` stays 200); serve's canary must call it `hung` within `HUNG_BOUND_S` of the
trigger and restart vLLM (the second restart, same budget), healthy again after. Every wait is on a fact
(an output line, a row, a counter) with a generous bound, never a fixed sleep, so CPU load cannot make it
flaky.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from deploykit.canary.defaults import HUNG_AFTER_S
from deploykit.net import free_port
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS
from tests.e2e.test_serve_e2e import START_TIMEOUT_S, command_env, demo_variant
from tests.serve_helpers import CommandRun, completion_streams, group_members
from tests.vllm_harness import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.runs_alone]  # its soak is load it makes itself

EVERY_S = 2
WAIT_S = 900.0
LOAD_S = float(os.environ.get("DEPLOYKIT_TEST_SERVE_CANARY_LOAD_S", "60"))
ROTATION_RUNS = 7  # every case of the demo profile's rotation, and one more
HUNG_BOUND_S = HUNG_AFTER_S + 30.0
"""From the hang's trigger to serve's `hung` line: the bound, then a canary interval and a few /metrics
reads (docs/serve.md states it)."""


def metrics(base: str) -> dict[str, float]:
    text = httpx.get(base + "/metrics", timeout=30).text
    return {
        key: float(value)
        for key, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    }


def runs(base: str) -> int:
    return int(sum(v for k, v in metrics(base).items() if k.startswith("deploykit_canary_runs_total")))


def rows(store_url: str) -> list[ResultRecord]:
    store = open_store(store_url)
    try:
        return list(reversed(store.recent(limit=100)))
    finally:
        store.close()


def story(store_url: str) -> list[tuple[str, str, str]]:
    return [(r.command, r.stage, r.verdict) for r in rows(store_url)]


def gone(pid: int) -> bool:
    return group_members(pid) == []


def wait_until(fact: Callable[[], bool], what: str, run: CommandRun, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not fact():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{run.tail()}"
        time.sleep(0.2)


def hang_and_wait_for_the_restart(port: int, run: CommandRun) -> tuple[float, re.Match[str]]:
    """Send the hang's trigger (its answer never comes: a thread waits for it, and gives up when the server
    goes away), check /health still says 200, and return the seconds until serve's `hung` line and the
    restart's line."""
    import threading

    trigger = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "hang"}}
    base = f"http://127.0.0.1:{port}"

    def send() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server is stopped under it: expected
            httpx.post(base + "/v1/completions", json=trigger, timeout=WAIT_S)

    sent = time.monotonic()
    threading.Thread(target=send, name="hang-trigger", daemon=True).start()
    health: list[int | None] = []  # what /health says while the engine hangs, until serve's verdict
    while True:
        try:
            health.append(httpx.get(base + "/health", timeout=30).status_code)
        except httpx.HTTPError:  # serve may be stopping it by now
            health.append(None)
        try:
            run.wait_for(r"canary: HUNG: the engine is hung", 1.0)
            break
        except AssertionError:
            assert time.monotonic() - sent < WAIT_S, run.tail()
    hung_at = time.monotonic() - sent
    # The hang keeps /health at 200 (the first ten reads, well inside the bound): only progress tells.
    assert len(health) >= 10 and health[:10] == [200] * 10, health
    return hung_at, run.wait_for(r"^vLLM restarted: pid (\d+) .*restart2", WAIT_S)


def test_serve_canary_quiet_under_load_then_restarts_on_corruption(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    # vLLM's NaN counter off: this test is about the probe runs (tests/e2e/test_live_nan_e2e.py: the counter).
    profile = demo_variant(
        tmp_path, "tiny-faulty", serve__extra_args=["--worker-cls", WORKER_CLS], serve__count_nan_logits=False
    )
    port, canary_port = free_port(), free_port()
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    env = command_env(
        tmp_path,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        DEPLOYKIT_MODEL_CACHE=str(tiny_model_dir.parent),
        **{TOKENS_ENV: "off"},
    )
    args = ["serve", "--profile", str(profile), "--port", str(port), "--store", store_url]
    args += ["--canary-every", str(EVERY_S), "--canary-listen", f"127.0.0.1:{canary_port}"]
    run = CommandRun(args, env)
    canary = f"http://127.0.0.1:{canary_port}"
    try:
        run.wait_for(r"^serving tiny at ", START_TIMEOUT_S)
        # The start's own row comes first; the canary's first run may already have stored its row too
        # (its run starts as serving begins, and a loaded machine can be slow to read the line above).
        assert story(store_url)[0] == ("serve", "done", "pass")
        # The canary's first verdict: healthy, one row.
        wait_until(lambda: len(rows(store_url)) >= 2, "the canary's first row", run)
        assert story(store_url)[1] == ("canary", "state:healthy", "pass")
        assert httpx.get(canary + "/healthz", timeout=30).status_code == 200

        # No false alarm while the server is busy: 8 concurrent streams, the canary still running.
        statuses: set[int] = set()
        with completion_streams(f"http://127.0.0.1:{port}", 8) as errors:
            started = time.monotonic()
            while time.monotonic() - started < LOAD_S:
                statuses.add(httpx.get(canary + "/healthz", timeout=30).status_code)
                time.sleep(1)
        wait_until(lambda: runs(canary) >= ROTATION_RUNS, "a whole rotation of canary runs", run)
        assert not errors, errors[:3]
        assert statuses == {200}, run.tail()
        assert not [k for k in metrics(canary) if k.startswith("deploykit_canary_failures_total")], run.tail()
        assert story(store_url) == [("serve", "done", "pass"), ("canary", "state:healthy", "pass")]
        assert "vLLM restarted" not in run.output

        # Break the model for good: one marked request. HTTP 200 and /health 200 all the same.
        before = runs(canary)
        trigger = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "corrupt"}}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            assert client.post("/v1/completions", json=trigger).status_code == 200
            assert client.get("/health").status_code == 200
        broke_at = runs(canary)

        # Detected within one interval: the run in flight at the trigger may pass, the next one fails.
        wait_until(lambda: httpx.get(canary + "/healthz", timeout=30).status_code == 503, "/healthz 503", run)
        corrupt = next(r for r in rows(store_url) if r.stage == "state:corrupt")
        assert before < (corrupt.timings["runs"] or 0) <= broke_at + 2, (corrupt.timings, before, broke_at)
        assert corrupt.command == "canary" and corrupt.verdict == "fail"
        assert "NaN" in corrupt.diagnosis or "special/pad token" in corrupt.diagnosis, corrupt.diagnosis

        # serve restarts vLLM; the restarted server's smoke passes; the canary turns healthy again.
        restarted = run.wait_for(r"^vLLM restarted: pid (\d+)", WAIT_S)
        wait_until(
            lambda: story(store_url)[-1] == ("canary", "state:healthy", "pass") and len(rows(store_url)) >= 6,
            "the canary healthy again after the restart",
            run,
        )
        assert httpx.get(canary + "/healthz", timeout=30).status_code == 200
        assert story(store_url) == [
            ("serve", "done", "pass"),  # the first start's smoke
            ("canary", "state:healthy", "pass"),
            ("canary", "state:corrupt", "fail"),  # the corruption
            ("serve", "corruption", "fail"),  # the decision: restart
            ("serve", "done", "pass"),  # the restarted server's smoke
            ("canary", "state:healthy", "pass"),
        ]
        decision, resmoke = rows(store_url)[3], rows(store_url)[4]
        assert "restarting it" in decision.diagnosis and decision.timings["restart"] == 1.0, (
            decision.diagnosis
        )
        assert resmoke.timings["restart"] == 1.0 and resmoke.log_path and "restart1" in resmoke.log_path
        failures = {
            k: v for k, v in metrics(canary).items() if k.startswith("deploykit_canary_failures_total")
        }
        assert failures and all('reason="wrong"' in key for key in failures), failures
        assert metrics(canary)["deploykit_canary_healthy"] == 1.0

        # A hung engine: one marked request blocks the forward pass for good; /health stays 200.
        hung_at, second = hang_and_wait_for_the_restart(port, run)
        print(f"\nhung engine: serve said hung {hung_at:.1f} s after the trigger (bound {HUNG_BOUND_S:g} s)")
        assert hung_at <= HUNG_BOUND_S, hung_at
        wait_until(
            lambda: story(store_url)[-1] == ("canary", "state:healthy", "pass"),
            "the canary healthy again after the hang's restart",
            run,
        )
        after_hang = story(store_url)[6:]
        assert after_hang[:3] == [
            ("canary", "state:hung", "fail"),
            ("serve", "corruption", "fail"),  # the decision: restart (the same budget as corruption)
            ("serve", "done", "pass"),  # the restarted server's smoke
        ], after_hang
        decision = rows(store_url)[7]
        assert decision.diagnosis.startswith("engine hung: hung: the engine is hung"), decision.diagnosis
        assert "restart 2 of at most" in decision.diagnosis and decision.timings["restart"] == 2.0

        run.process.send_signal(signal.SIGTERM)
        assert run.finish(120) == 0, run.tail()
        for pid in (run.vllm_pid(), int(restarted.group(1)), int(second.group(1))):
            assert pid is not None
            wait_until(functools.partial(gone, pid), f"vLLM group {pid} gone", run, 30)
        assert re.search(r"vLLM stopped; nothing left running", run.output)
    finally:
        run.stop(120)
