"""The fingerprint on real logits: SmolLM2-135M-Instruct on the real vLLM CPU build (the session's one
`deploykit serve` of smollm2-cpu, tests/e2e/real_model.py), with the test-only finite-drift fault
(tests/e2e/drift_worker.py). Its top-1/top-2 gaps are real (a median above 1 nat on the probe set,
docs/fingerprints.md), so this proves that the tolerance, first tuned on a tiny model where nothing was
close, catches a finite drift where the margins are a real model's.

The path is the production one: the baseline is the one serve's start-up smoke stored (two readings, its
noise measured); the canary, keyed as `deploykit canary --profile` keys it, matches it; after the drift
starts, the canary's next run fails on the fingerprint alone (its completion case passes: finite, ordinary
words), naming the probe, the position, the ids and a baseline gap far above the near-tie margin.

The upgrade gate (docs/gate.md) judges the same server against the same stored baseline, as a candidate:
`promote` before the drift, `hold: drift` after it, at the same clear margin.

The drift is permanent for that vLLM: this test runs after every other test of the session
(`drifts_real_model`, ordered last by tests/e2e/conftest.py).
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from typing import Any

import httpx
import pytest

from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.canary.settings import CanarySettings
from deploykit.endpoint import Endpoint
from deploykit.fleet_baseline import check_for_server
from deploykit.profile.load import load_profile
from deploykit.profile.schema import SmokeCase
from deploykit.results.sql.store import open_store
from deploykit.smoke.fingerprint import tie_margin
from tests.e2e.drift_worker import FAULT_KEY, MARKER
from tests.e2e.real_model import RealModelServer
from tests.serve_helpers import deploykit_executable

pytestmark = [pytest.mark.e2e, pytest.mark.drifts_real_model]

TIMEOUT_S = 300.0


def drift_now(server: RealModelServer) -> None:
    trigger = {
        "model": server.served_name,
        "prompt": "hi",
        "max_tokens": 2,
        "vllm_xargs": {FAULT_KEY: MARKER},
    }
    with httpx.Client(base_url=server.base_url, timeout=TIMEOUT_S) as client:
        assert client.post("/v1/completions", json=trigger).status_code == 200


def gate(server: RealModelServer) -> tuple[int, dict[str, Any]]:
    """`deploykit gate` with the server as the candidate and its key's stored baseline (serve's)."""
    args = ["gate", "--profile", str(server.profile_path), "--url", server.base_url]
    args += ["--store", server.store_url, "--no-load", "--format", "json"]
    done = subprocess.run(
        [deploykit_executable(), *args], env=server.env, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert done.stdout.startswith("{"), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


def test_finite_drift_on_the_real_model_fails_the_canarys_fingerprint(
    real_model_server: RealModelServer,
) -> None:
    server = real_model_server
    loaded = load_profile(str(server.profile_path))
    check = check_for_server(loaded, Endpoint(server.base_url), store_url=server.store_url)
    assert check is not None and check.dtype == "float32"
    store = open_store(server.store_url)
    try:
        baseline = store.active_baseline(check.key)  # serve's start-up smoke made it
    finally:
        store.close()
    assert baseline is not None and baseline.fingerprint is not None, "serve stored no baseline"
    assert baseline.fingerprint.near_ties == 0 and baseline.fingerprint.tolerance > 0

    config = CanaryConfig(
        endpoint=Endpoint(server.base_url),
        served_name=server.served_name,
        cases=[SmokeCase(kind="completion", max_tokens=8)],
        settings=CanarySettings(timeout_s=TIMEOUT_S, metrics_every_s=0),
        store=False,
        fingerprint=check,
    )
    canary = Canary(config)
    healthy = canary.run_once()
    assert healthy.outcome == "pass", healthy.report.diagnosis
    assert f"matches baseline #{baseline.id}: row #{baseline.result_id}" in healthy.report.cases[-1].text

    code, report = gate(server)
    assert (code, report["verdict"]) == (0, "promote"), report["summary"]
    assert report["baseline"]["source"].startswith(f"stored baseline #{baseline.id} ")

    drift_now(server)
    code, report = gate(server)
    assert (code, report["verdict"], report["reason"]) == (6, "hold", "drift"), report["summary"]
    drift = report["drift"]
    assert drift["got_id"] != drift["expected_id"] and not drift["near_tie"]
    assert drift["baseline_gap"] > 100 * tie_margin(baseline.fingerprint.tolerance), drift
    caught = canary.run_once()
    assert caught.outcome == "wrong", caught.report.diagnosis
    failed = [c.name for c in caught.report.cases if not c.passed]
    assert failed == ["fingerprint"], caught.report.diagnosis  # today's check passes the drift
    diagnosis = caught.report.diagnosis
    assert f"row #{baseline.result_id} from host {socket.gethostname()}" in diagnosis, diagnosis
    found = re.search(
        r"expected id \d+, got id \d+; the baseline's top-1/top-2 logprob gap there is (\S+)", diagnosis
    )
    assert found is not None, diagnosis
    # Caught at a clear margin of real logits (0.27 nats measured), not at a near tie of a flat model.
    assert float(found.group(1)) > 100 * tie_margin(baseline.fingerprint.tolerance), diagnosis
    assert canary.state.status == "corrupt"
