"""`deploykit canary` as a real command against the real vLLM CPU build (one vLLM start).

The server runs the test-only `FaultWorker` with its length trigger off: it is healthy until the test sends
one request marked `deploykit_test_fault`, after which every forward pass returns NaN for good (HTTP 200,
`/health` 200). In file order:
  1. no false alarm: 8 concurrent streams for 60 s (DEPLOYKIT_TEST_CANARY_LOAD_S) with a 2 s interval (~30
     runs under load; 3 minutes at 5 s gave ~36), and not one failure;
  2. corruption triggered after start-up: the next run after the trigger fails and `/healthz` turns 503.
Timing is stated in runs (read from `/metrics`), not in seconds, so CPU load cannot make them flaky.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from deploykit.net import free_port
from deploykit.results.sql.store import open_store
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS
from tests.serve_helpers import CommandRun, completion_streams
from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

pytestmark = [pytest.mark.e2e, pytest.mark.runs_alone]  # its soak is load it makes itself

LOAD_S = float(os.environ.get("DEPLOYKIT_TEST_CANARY_LOAD_S", "60"))
EVERY_S = 2
ROTATION = ["completion", "chat", "repeat", "long_then_short", "prefix_cache", "batch"]


@dataclass
class CanaryRun:
    server: RunningServer
    run: CommandRun
    base: str
    store_url: str

    def metrics(self) -> dict[str, float]:
        text = httpx.get(self.base + "/metrics", timeout=30).text
        return {
            key: float(value)
            for key, value in (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
        }

    def runs(self) -> int:
        return int(sum(v for k, v in self.metrics().items() if k.startswith("deploykit_canary_runs_total")))

    def failures(self) -> dict[str, float]:
        return {k: v for k, v in self.metrics().items() if k.startswith("deploykit_canary_failures_total")}

    def healthz(self) -> int:
        return httpx.get(self.base + "/healthz", timeout=30).status_code

    def wait_runs(self, count: int, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while self.runs() < count:
            assert time.monotonic() < deadline, (
                f"fewer than {count} canary runs in {timeout} s:\n{self.run.tail()}"
            )
            time.sleep(0.5)

    def rows(self) -> list[tuple[str, str]]:
        store = open_store(self.store_url)
        try:
            return [(r.stage, r.verdict) for r in reversed(store.recent(limit=100)) if r.command == "canary"]
        finally:
            store.close()


@pytest.fixture(scope="module")
def canary(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanaryRun]:
    tmp = tmp_path_factory.mktemp("canary")
    env = {"PYTHONPATH": str(REPO), TOKENS_ENV: "off"}
    with running_vllm([*tiny_serve_args(tiny_model_dir), "--worker-cls", WORKER_CLS], env=env) as server:
        port = free_port()
        store_url = f"sqlite:///{tmp / 'results.sqlite'}"
        command_env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "DEPLOYKIT_MODEL_CACHE": str(tiny_model_dir.parent),
        }
        args = ["canary", "--url", server.base_url, "--profile", "demo-cpu", "--every", str(EVERY_S)]
        run = CommandRun([*args, "--listen", f"127.0.0.1:{port}", "--store", store_url], command_env)
        try:
            run.wait_for(r"^canary for tiny at ", 120)
            yield CanaryRun(server, run, f"http://127.0.0.1:{port}", store_url)
        finally:
            run.stop(120)


def test_no_false_alarm_under_8_concurrent_streams(canary: CanaryRun) -> None:
    canary.wait_runs(1)
    statuses: set[int] = set()
    with completion_streams(canary.server.base_url, 8) as errors:
        started = time.monotonic()
        while time.monotonic() - started < LOAD_S:
            statuses.add(canary.healthz())
            time.sleep(1)
    # Every case of the rotation ran at least once (under load or just after it).
    canary.wait_runs(len(ROTATION) + 1)
    assert not errors, errors[:3]
    assert statuses == {200}
    assert canary.failures() == {}, canary.run.tail()
    assert canary.metrics()["deploykit_canary_healthy"] == 1.0
    assert canary.rows() == [("state:healthy", "pass")]  # one row for the first verdict; none per run


def test_corruption_after_startup_is_caught_within_one_interval(canary: CanaryRun) -> None:
    assert canary.healthz() == 200
    before = canary.runs()
    trigger = {"model": "tiny", "prompt": "hello", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: "corrupt"}}
    with httpx.Client(base_url=canary.server.base_url, timeout=120) as client:
        assert client.post("/v1/completions", json=trigger).status_code == 200
        assert client.get("/health").status_code == 200
    broke_at = canary.runs()
    # The run in flight when the trigger landed may still pass; the next one to start must fail.
    deadline = time.monotonic() + 600
    while canary.healthz() != 503:
        assert canary.runs() <= broke_at + 1, f"a whole run after the trigger passed:\n{canary.run.tail()}"
        assert time.monotonic() < deadline, canary.run.tail()
        time.sleep(0.2)
    assert canary.runs() <= broke_at + 2 and canary.runs() > before
    failures = canary.failures()
    assert failures and all('reason="wrong"' in key for key in failures), failures
    assert canary.metrics()["deploykit_canary_healthy"] == 0.0
    body = httpx.get(canary.base + "/healthz", timeout=30).text
    assert body.startswith("corrupt: ") and ("NaN" in body or "0 or a special/pad token" in body), body
    canary.run.wait_for(r"^state: corrupt: .*\(/healthz 503\)", 60)
    assert canary.rows() == [("state:healthy", "pass"), ("state:corrupt", "fail")]
    # It stays 503: the corruption is for good, and every later run says so.
    canary.wait_runs(canary.runs() + 2)
    assert canary.healthz() == 503
    assert canary.rows() == [("state:healthy", "pass"), ("state:corrupt", "fail")]
