"""NaN on live traffic, between canary runs: the real vLLM CPU build counts it, `deploykit canary` sees it.

vLLM runs the test-only `FaultWorker` (length trigger off) with `VLLM_COMPUTE_NANS_IN_LOGITS=1`, as the plan
sets it. Two real `deploykit canary` commands watch it with a 600 s probe interval, so after their first run
no probe runs for the rest of the test: one reads vLLM's NaN counter every second (`--metrics-every 1`),
the other does not (`--metrics-every 0`, what the canary did before). One user request hits the fault (its
later tokens' logits are NaN, HTTP 200): the first canary's `/healthz` turns 503 within seconds, with a
row and its own /metrics saying why; the second stays 200 until its next run, ten minutes away.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploykit.net import free_port
from tests.e2e.fault_worker import FAULT_KEY, TOKENS_ENV, WORKER_CLS
from tests.e2e.test_canary_e2e import CanaryRun
from tests.serve_helpers import CommandRun
from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

EVERY_S = 600
WITHIN_S = 15.0
"""The reading is every second; the rest is the request finishing and a slow shared machine."""


def start_canary(server: RunningServer, model: Path, tmp: Path, name: str, metrics_every: float) -> CanaryRun:
    port = free_port()
    store_url = f"sqlite:///{tmp / f'{name}.sqlite'}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "DEPLOYKIT_MODEL_CACHE": str(model.parent)}
    args = ["canary", "--url", server.base_url, "--profile", "demo-cpu", "--every", str(EVERY_S)]
    args += ["--metrics-every", str(metrics_every), "--listen", f"127.0.0.1:{port}", "--store", store_url]
    run = CommandRun(args, env)
    run.wait_for(r"^canary for tiny at ", 120)
    return CanaryRun(server, run, f"http://127.0.0.1:{port}", store_url)


@pytest.fixture(scope="module")
def watched(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningServer, CanaryRun, CanaryRun]]:
    tmp = tmp_path_factory.mktemp("live-nan")
    env = {"PYTHONPATH": str(REPO), TOKENS_ENV: "off", "VLLM_COMPUTE_NANS_IN_LOGITS": "1"}
    with running_vllm([*tiny_serve_args(tiny_model_dir), "--worker-cls", WORKER_CLS], env=env) as server:
        reading = start_canary(server, tiny_model_dir, tmp, "reading", 1)
        try:
            blind = start_canary(server, tiny_model_dir, tmp, "blind", 0)
            try:
                yield server, reading, blind
            finally:
                blind.run.stop(120)
        finally:
            reading.run.stop(120)


def test_one_user_request_with_nan_logits_turns_healthz_503_within_seconds(
    watched: tuple[RunningServer, CanaryRun, CanaryRun],
) -> None:
    server, reading, blind = watched
    for canary in (reading, blind):
        canary.wait_runs(1)
        canary.run.wait_for(r"^state: healthy: ", 120)
        assert canary.healthz() == 200
    assert reading.metrics()["deploykit_canary_vllm_corrupted_requests"] == 0.0
    assert blind.metrics()["deploykit_canary_vllm_corrupted_requests"] == -1.0  # never read

    # One user request that hits the fault: HTTP 200, /health 200, and its logits NaN after the first step.
    request = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "vllm_xargs": {FAULT_KEY: "corrupt"}}
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        assert client.post("/v1/completions", json=request).status_code == 200
        answered = time.monotonic()
        assert client.get("/health").status_code == 200

    while reading.healthz() != 503:
        assert time.monotonic() - answered < WITHIN_S, reading.run.tail()
        time.sleep(0.1)
    took = time.monotonic() - answered
    body = httpx.get(reading.base + "/healthz", timeout=30).text
    assert body.startswith("corrupt: live traffic: vLLM counted 1 more request(s) with NaN logits"), body
    metrics = reading.metrics()
    assert metrics["deploykit_canary_healthy"] == 0.0
    assert metrics["deploykit_canary_vllm_corrupted_requests"] == 1.0
    assert metrics["deploykit_canary_live_nan_requests_total"] == 1.0
    assert metrics['deploykit_canary_corrupt{cause="live_nan"}'] == 1.0
    reading.run.wait_for(r"^live traffic: WRONG: vLLM counted 1 more request", 30)
    reading.run.wait_for(r"^state: corrupt: live traffic: .*\(/healthz 503\)", 30)
    assert reading.rows() == [("state:healthy", "pass"), ("state:corrupt", "fail")]
    # Long before the next probe: neither canary ran again, and the one that does not read the counter
    # still says 200.
    assert reading.runs() == 1 and blind.runs() == 1
    assert blind.healthz() == 200 and blind.rows() == [("state:healthy", "pass")]
    print(f"/healthz 503 {took:.1f} s after the request's answer (probe interval {EVERY_S} s)")


def test_serve_restarts_vllm_on_nan_counted_on_live_traffic(tiny_model_dir: Path, tmp_path: Path) -> None:
    """`serve --canary-every 600`: the plan sets the variable, the in-process canary reads the counter, and
    one user request with NaN logits makes serve stop and restart vLLM, without waiting for a run."""
    from tests.e2e.test_serve_canary_e2e import rows, story, wait_until
    from tests.e2e.test_serve_e2e import START_TIMEOUT_S, command_env, demo_variant

    profile = demo_variant(tmp_path, "tiny-faulty", serve__extra_args=["--worker-cls", WORKER_CLS])
    port, canary_port = free_port(), free_port()
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    env = command_env(
        tmp_path,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        DEPLOYKIT_MODEL_CACHE=str(tiny_model_dir.parent),
        **{TOKENS_ENV: "off"},
    )
    env.pop("VLLM_COMPUTE_NANS_IN_LOGITS", None)  # the plan must set it, not the test
    args = ["serve", "--profile", str(profile), "--port", str(port), "--store", store_url]
    args += ["--canary-every", str(EVERY_S), "--canary-listen", f"127.0.0.1:{canary_port}"]
    run = CommandRun(args, env)
    canary = f"http://127.0.0.1:{canary_port}"
    try:
        run.wait_for(r"^serving tiny at ", START_TIMEOUT_S)
        wait_until(lambda: len(rows(store_url)) >= 2, "the canary's first row", run)
        assert story(store_url) == [("serve", "done", "pass"), ("canary", "state:healthy", "pass")]
        request = {"model": "tiny", "prompt": "hello", "max_tokens": 4, "vllm_xargs": {FAULT_KEY: "corrupt"}}
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
            assert client.post("/v1/completions", json=request).status_code == 200
        answered = time.monotonic()
        wait_until(
            lambda: any(r.stage == "state:corrupt" for r in rows(store_url)),
            "the live NaN row",
            run,
            WITHIN_S,
        )
        took = time.monotonic() - answered
        corrupt = next(r for r in rows(store_url) if r.stage == "state:corrupt")
        assert "live traffic: vLLM counted 1 more request(s) with NaN logits" in corrupt.diagnosis
        assert corrupt.timings["runs"] == 1.0  # no probe run since the first
        assert httpx.get(canary + "/healthz", timeout=30).status_code == 503
        run.wait_for(r"^vLLM restarted: pid (\d+)", START_TIMEOUT_S)
        wait_until(lambda: len(rows(store_url)) >= 5, "the restarted server's smoke row", run)
        assert story(store_url) == [
            ("serve", "done", "pass"),
            ("canary", "state:healthy", "pass"),
            ("canary", "state:corrupt", "fail"),  # the live NaN
            ("serve", "corruption", "fail"),  # the decision: restart
            ("serve", "done", "pass"),  # the restarted server's smoke
        ]
        print(f"serve: the live NaN row {took:.1f} s after the answer; vLLM restarted")
    finally:
        run.stop(120)
