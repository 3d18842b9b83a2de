"""Fingerprints against the real vLLM CPU build, with the test-only finite-drift fault
(tests/e2e/drift_worker.py): after its trigger every answer is finite, consistent with itself and made of
ordinary words, and wrong.

1. Today's checks (NaN, token 0/specials, repeat, long→short, prefix cache, batch) pass the drifted server;
   the fingerprint check fails it, naming the probe, the position, the ids and the baseline's row and host.
2. A second replica that drifts from its first request fails its start-up smoke against the first replica's
   baseline in a shared store (SQLite and PostgreSQL), and the baseline stays the healthy one.
3. `serve --canary-every` restarts vLLM when the drift starts while serving.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploykit.net import free_port
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from tests.e2e.drift_worker import FAULT_KEY, FROM_START_ENV, MARKER, WORKER_CLS
from tests.e2e.test_serve_e2e import START_TIMEOUT_S, command_env, demo_variant
from tests.serve_helpers import BACKENDS, CommandRun, deploykit_executable, fresh_store_url
from tests.vllm_harness import REPO, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

ALL_CHECKS = [{"kind": kind} for kind in ("completion", "chat", "repeat", "long_then_short", "prefix_cache")]
ALL_CHECKS.append({"kind": "batch", "batch_size": 4})
HOST = socket.gethostname()
WAIT_S = 900.0
# The demo profile allows 300 s to start; a start took longer here while other test sessions shared the cores.
SLOW_MACHINE_START = {"deploy__startup_timeout_s": int(START_TIMEOUT_S)}


def env_for(tmp: Path, tiny_model_dir: Path, **extra: str) -> dict[str, str]:
    return command_env(
        tmp,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        DEPLOYKIT_MODEL_CACHE=str(tiny_model_dir.parent),
        **extra,
    )


def deploykit(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [deploykit_executable(), *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=WAIT_S
    )


def said(result: subprocess.CompletedProcess[str]) -> str:
    """deploykit's own lines (vLLM's echoed log left out): what an assertion message needs."""
    own = [line for line in result.stdout.splitlines() if not line.startswith(("(", "INFO", "WARNING"))]
    return "\n".join(own[-40:]) + "\n" + result.stderr[-2000:]


def rows(store_url: str) -> list[ResultRecord]:
    store = open_store(store_url)
    try:
        return list(reversed(store.recent(limit=100)))
    finally:
        store.close()


def drift_now(base_url: str) -> None:
    trigger: dict[str, Any] = {
        "model": "tiny",
        "prompt": "hi",
        "max_tokens": 2,
        "vllm_xargs": {FAULT_KEY: MARKER},
    }
    with httpx.Client(base_url=base_url, timeout=120) as client:
        assert client.post("/v1/completions", json=trigger).status_code == 200
        assert client.get("/health").status_code == 200


def test_finite_drift_passes_todays_checks_and_fails_the_fingerprint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    checked = demo_variant(tmp_path, "tiny-checked", smoke__cases=ALL_CHECKS)
    today = demo_variant(
        tmp_path, "tiny-today", smoke__cases=ALL_CHECKS, smoke__fingerprint={"enabled": False}
    )
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    env = env_for(tmp_path, tiny_model_dir)
    with running_vllm(
        [*tiny_serve_args(tiny_model_dir), "--worker-cls", WORKER_CLS], env={"PYTHONPATH": str(REPO)}
    ) as server:
        smoke = ["smoke", "--url", server.base_url, "--store", store_url, "--profile"]
        healthy = deploykit([*smoke, str(checked)], env)
        assert healthy.returncode == 0, said(healthy)
        first = rows(store_url)[-1]
        assert first.fingerprint is not None and first.fingerprint.comparison is not None
        assert first.fingerprint.comparison.verdict == "new" and first.fingerprint.near_ties == 0
        assert first.fingerprint.key_parts["dtype"] == "float32" and first.fingerprint.noise == 0.0

        drift_now(server.base_url)
        passed = deploykit([*smoke, str(today)], env)
        assert passed.returncode == 0, said(passed)  # today's checks: every case passes the drift
        assert "all 13 cases passed" in passed.stdout, passed.stdout

        caught = deploykit([*smoke, str(checked)], env)
        assert caught.returncode == 1, said(caught)
        row = rows(store_url)[-1]
        assert row.verdict == "fail" and [c.name for c in row.cases if not c.passed] == ["fingerprint"]
        assert f"baseline #1: row #{first.id} from host {HOST}" in row.diagnosis, row.diagnosis
        assert "at generated position" in row.diagnosis and "expected id" in row.diagnosis, row.diagnosis
        assert row.fingerprint is not None and row.fingerprint.comparison is not None
        assert row.fingerprint.comparison.verdict == "mismatch"
        assert row.fingerprint.comparison.baseline_row == first.id


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_replica_that_drifts_from_the_start_fails_against_the_first_replicas_baseline(
    backend: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    profile = demo_variant(
        tmp_path, "tiny-replica", serve__extra_args=["--worker-cls", WORKER_CLS], **SLOW_MACHINE_START
    )
    with fresh_store_url(backend, tmp_path) as store_url:
        serve = ["serve", "--profile", str(profile), "--check", "--store", store_url]
        first = deploykit([*serve, "--port", str(free_port())], env_for(tmp_path, tiny_model_dir))
        assert first.returncode == 0, said(first)
        faulty_env = env_for(tmp_path, tiny_model_dir, **{FROM_START_ENV: "1"})
        second = deploykit([*serve, "--port", str(free_port())], faulty_env)
        assert second.returncode == 1, said(second)
        healthy, faulty = [r for r in rows(store_url) if r.command == "serve"]
        assert healthy.verdict == "pass" and faulty.verdict == "fail" and faulty.stage == "done"
        assert [c.name for c in faulty.cases if not c.passed] == ["fingerprint"], faulty.diagnosis
        assert f"row #{healthy.id} from host {HOST}" in faulty.diagnosis, faulty.diagnosis
        store = open_store(store_url)
        try:
            assert faulty.fingerprint is not None
            baseline = store.active_baseline(faulty.fingerprint.key)
        finally:
            store.close()
        assert baseline is not None and baseline.result_id == healthy.id  # the faulty one never became it


def test_serve_restarts_vllm_when_the_drift_starts_while_serving(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    profile = demo_variant(
        tmp_path,
        "tiny-drifting",
        serve__extra_args=["--worker-cls", WORKER_CLS],
        serve__count_nan_logits=False,
        **SLOW_MACHINE_START,
    )
    port, canary_port = free_port(), free_port()
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    args = ["serve", "--profile", str(profile), "--port", str(port), "--store", store_url]
    args += ["--canary-every", "2", "--canary-listen", f"127.0.0.1:{canary_port}"]
    run = CommandRun(args, env_for(tmp_path, tiny_model_dir))
    try:
        run.wait_for(r"^serving tiny at ", START_TIMEOUT_S)
        run.wait_for(r"^canary state: healthy", WAIT_S)
        drift_now(f"http://127.0.0.1:{port}")
        run.wait_for(
            r"canary run \d+ .*: WRONG: .*fingerprint: the fingerprint differs from baseline", WAIT_S
        )
        run.wait_for(r"^vLLM restarted: pid \d+", WAIT_S)
        deadline = time.monotonic() + WAIT_S
        while not any(
            r.command == "serve" and r.timings.get("restart") == 1.0 and r.stage == "done"
            for r in rows(store_url)
        ):
            assert time.monotonic() < deadline, run.tail()
            time.sleep(0.5)
        story = [(r.command, r.stage, r.verdict) for r in rows(store_url)]
        assert story[:5] == [
            ("serve", "done", "pass"),
            ("canary", "state:healthy", "pass"),
            ("canary", "state:corrupt", "fail"),
            ("serve", "corruption", "fail"),
            ("serve", "done", "pass"),  # the restarted server matches the baseline again
        ], story
        corrupt = rows(store_url)[2]
        assert "expected id" in corrupt.diagnosis and f"from host {HOST}" in corrupt.diagnosis, (
            corrupt.diagnosis
        )
    finally:
        run.stop(120)
