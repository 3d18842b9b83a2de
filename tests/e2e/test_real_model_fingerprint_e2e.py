"""The fingerprint on real logits: SmolLM2-135M-Instruct on the real vLLM CPU build, with the test-only
finite-drift fault (tests/e2e/drift_worker.py). Its top-1/top-2 gaps are real (a median above 1 nat on the
probe set, docs/fingerprints.md), so this is the proof that the fingerprint's tolerance, tuned where nothing
was close on the tiny model, still catches a finite drift where the margins are a real model's.

The path is the production one: a baseline taken as the smoke takes it (two readings, its noise measured)
and stored in a real SQLite store; the canary's run compares one reading with it; after the drift starts
the canary's next run fails on the fingerprint alone (its completion case passes: finite, ordinary words),
naming the probe, the position, the ids and a baseline gap above the near-tie margin.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.fleet_baseline import FingerprintCheck, fingerprint_case
from deploykit.profile.schema import SmokeCase
from deploykit.smoke.fingerprint import tie_margin
from deploykit.store import ResultRecord, open_store
from tests.e2e.drift_worker import FAULT_KEY, MARKER, WORKER_CLS
from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e

SERVED = "smollm2"
TIMEOUT_S = 300.0
PARTS = {"model": "builtin:smollm2-135m-instruct", "dtype": "float32", "probe_set": 1, "test": "drift"}


@pytest.fixture(scope="module")
def drifting_smollm2() -> Iterator[RunningServer]:
    """SmolLM2 served as its profile serves it (float32, 256 MiB of KV cache), with the drift worker
    loaded (inert until a request carries the marker)."""
    from deploykit.smollm2 import ensure_smollm2

    args = tiny_serve_args(ensure_smollm2(), served_name=SERVED, max_model_len=2048)
    args[args.index("--kv-cache-memory-bytes") + 1] = "256M"
    with running_vllm(
        [*args, "--worker-cls", WORKER_CLS], served_name=SERVED, env={"PYTHONPATH": str(REPO)}
    ) as server:
        yield server


def drift_now(base_url: str) -> None:
    trigger = {"model": SERVED, "prompt": "hi", "max_tokens": 2, "vllm_xargs": {FAULT_KEY: MARKER}}
    with httpx.Client(base_url=base_url, timeout=TIMEOUT_S) as client:
        assert client.post("/v1/completions", json=trigger).status_code == 200


def test_finite_drift_on_the_real_model_fails_the_canarys_fingerprint(
    drifting_smollm2: RunningServer, tmp_path: Path
) -> None:
    server = drifting_smollm2
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    check = FingerprintCheck(key_parts=PARTS, dtype="float32", store_url=store_url)
    # The baseline, as the start-up smoke makes it: two readings, the noise between them measured.
    case, baseline = fingerprint_case(
        check, server.base_url, SERVED, timeout_s=TIMEOUT_S, api_key=None, readings=2
    )
    assert case.passed and baseline is not None, case.diagnosis
    assert baseline.comparison is not None and baseline.comparison.verdict == "new"
    store = open_store(store_url)
    try:
        row = store.add(
            ResultRecord(verdict="pass", stage="done", hostname=check.hostname, fingerprint=baseline)
        )
    finally:
        store.close()

    config = CanaryConfig(
        url=server.base_url,
        served_name=SERVED,
        cases=[SmokeCase(kind="completion", max_tokens=8)],
        timeout_s=TIMEOUT_S,
        store=False,
        metrics_every_s=0,
        fingerprint=check,
    )
    canary = Canary(config)
    healthy = canary.run_once()
    assert healthy.outcome == "pass", healthy.report.diagnosis
    assert f"matches baseline #1: row #{row}" in healthy.report.cases[-1].text

    drift_now(server.base_url)
    caught = canary.run_once()
    assert caught.outcome == "wrong", caught.report.diagnosis
    failed = [c.name for c in caught.report.cases if not c.passed]
    assert failed == ["fingerprint"], caught.report.diagnosis  # today's check passes the drift
    diagnosis = caught.report.diagnosis
    assert f"baseline #1: row #{row} from host {socket.gethostname()}" in diagnosis, diagnosis
    found = re.search(
        r"expected id (\d+), got id (\d+); the baseline's top-1/top-2 logprob gap there is (\S+)", diagnosis
    )
    assert found is not None, diagnosis
    # Caught at a clear margin of real logits, not at a near tie of a flat model.
    assert float(found.group(3)) > 100 * tie_margin(baseline.tolerance), diagnosis
    assert canary.state.status == "corrupt"
