"""Taking a fingerprint over real HTTP (a local server answering the probe set), comparing it with the
baseline in a real SQLite store, and the canary failing a run on it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from deploykit.canary.runner import Canary, CanaryConfig
from deploykit.endpoint import Endpoint
from deploykit.fleet_baseline import FingerprintCheck, fingerprint_case
from deploykit.profile.schema import SmokeCase
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.smoke import SmokeReport
from deploykit.smoke.fingerprint_probe import ProbeFailed, ProbeUnstable, take_fingerprint
from tests.http_server import serving

PARTS = {"model": "m", "dtype": "float32", "probe_set": 1}
NOISE = 2.07e-5


class _Probe(BaseHTTPRequestHandler):
    """Greedy answers that depend only on the prompt (a healthy deterministic model); `server.mode` changes
    them: `drift` (finite, consistent, different), `flaky` (the second reading differs from the first),
    `noisy` (healthy, but every other reading's logprobs are off by NOISE),
    `nan`, `unencodable` (vLLM's HTTP 400 for NaN logprobs), `busy`."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        server: Any = self.server
        server.count += 1
        mode = server.mode
        seed = sum(body["prompt"]) + (7 if mode == "drift" or (mode == "flaky" and server.count > 4) else 0)
        ids = [(seed * (n + 3)) % 500 + 10 for n in range(body["max_tokens"])]
        # `noisy`: every other reading (4 requests) is off by NOISE nats, as a batch of another shape is on a
        # real model (SmolLM2 in float32 on the CPU build: 2.07e-5 between a probe alone and in a batch).
        shift = NOISE if mode == "noisy" and (server.count - 1) // 4 % 2 else 0.0
        top = [{f"token_id:{i}": -0.25 + shift, f"token_id:{i + 1}": -0.5 + shift} for i in ids]
        if mode == "nan":
            top[0] = {f"token_id:{ids[0]}": float("nan")}
        status = {"busy": 503, "unencodable": 400}.get(mode, 200)
        answer: dict[str, Any] = {"choices": [{"token_ids": ids, "logprobs": {"top_logprobs": top}}]}
        if mode == "unencodable":  # what vLLM answers when the logprobs it must send are NaN
            answer = {"error": {"message": "Out of range float values are not JSON compliant", "code": 400}}
        payload = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[Any]:
    with serving(_Probe, mode="healthy", count=0) as url:
        url.server.url = str(url)
        yield url.server


def take(url: str, readings: int = 2) -> Any:
    return take_fingerprint(
        Endpoint(url, request_deadline_s=10), "m", dtype="float32", top_k=5, readings=readings
    )


def test_two_readings_of_a_deterministic_server_have_no_noise(server: Any) -> None:
    fingerprint = take(server.url)
    assert server.count == 8 and len(fingerprint.answers) == 4
    assert fingerprint.noise == 0.0 and fingerprint.tolerance == pytest.approx(4 * 2**-24 * 16)
    assert fingerprint.near_ties == 0
    assert take(server.url, readings=1).answers == fingerprint.answers


def test_readings_that_disagree_at_a_clear_margin_are_unstable(server: Any) -> None:
    server.mode = "flaky"
    with pytest.raises(ProbeUnstable, match="read alone and read as one batch disagree"):
        take(server.url)


def test_a_busy_server_is_a_miss_and_a_nan_is_wrong(server: Any) -> None:
    server.mode = "busy"
    with pytest.raises(ProbeFailed) as busy:
        take(server.url)
    assert busy.value.miss
    server.mode = "nan"
    with pytest.raises(ProbeFailed) as nan:
        take(server.url)
    assert not nan.value.miss and "NaN" in str(nan.value)


def test_an_answer_vllm_could_not_encode_is_named_as_nan(server: Any) -> None:
    """A model whose logprobs are NaN makes vLLM answer HTTP 400 (out-of-range floats): the diagnosis
    says NaN, as the smoke's does, not just "HTTP 400"."""
    server.mode = "unencodable"
    with pytest.raises(ProbeFailed) as failed:
        take(server.url)
    assert not failed.value.miss and "NaN or infinite" in str(failed.value)


def test_the_first_fingerprint_becomes_the_baseline_and_a_drift_is_caught(
    server: Any, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    check = FingerprintCheck(key_parts=PARTS, dtype="float32", store_url=store_url, hostname="host-a")
    case, fingerprint = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=2)
    assert case.passed and fingerprint is not None and fingerprint.comparison is not None
    assert fingerprint.comparison.verdict == "new" and fingerprint.key == check.key
    store = open_store(store_url)
    try:
        row = store.add(
            ResultRecord(verdict="pass", stage="done", hostname="host-a", fingerprint=fingerprint)
        )
    finally:
        store.close()

    again, _ = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=1)
    assert (
        again.passed and again.text is not None and again.text.startswith(f"matches baseline #1: row #{row}")
    )

    server.mode = "drift"
    caught, drifted = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=2)
    assert not caught.passed and not caught.miss
    assert drifted is not None and drifted.comparison is not None and drifted.comparison.verdict == "mismatch"
    assert f"baseline #1: row #{row} from host host-a" in caught.diagnosis
    assert "probe 'pattern4' at generated position 0: expected id" in caught.diagnosis


def test_a_canary_reading_that_becomes_the_baseline_is_taken_twice_so_its_noise_is_measured(
    server: Any, tmp_path: Path
) -> None:
    """One reading has no noise to measure: a baseline made of one (a canary's first run on a new key) would
    be judged at the float32 floor (3.8e-6 nats), below a real model's batch-shape noise, and every later
    reading in another batch shape would be a false alarm."""
    server.mode = "noisy"
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    check = FingerprintCheck(key_parts=PARTS, dtype="float32", store_url=store_url, hostname="host-a")
    case, first = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=1)
    assert case.passed and first is not None and first.comparison is not None
    assert first.comparison.verdict == "new" and server.count == 12  # one reading, then two more
    assert first.noise == pytest.approx(NOISE) and first.tolerance == pytest.approx(4 * NOISE)
    store = open_store(store_url)
    try:
        store.add(ResultRecord(verdict="pass", stage="done", hostname="host-a", fingerprint=first))
    finally:
        store.close()
    for _ in range(2):  # one reading each, in either shape: both match
        later, _ = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=1)
        assert later.passed, later.diagnosis
    assert server.count == 20  # a key with a baseline: one reading per run


def test_without_a_store_the_fingerprint_is_taken_but_not_compared(server: Any) -> None:
    check = FingerprintCheck(key_parts=PARTS, dtype="float32", store=False)
    case, fingerprint = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=1)
    assert case.passed and "not compared" in case.warning and fingerprint is not None


def test_the_canary_fails_a_run_whose_fingerprint_differs_from_the_baseline(
    server: Any, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    check = FingerprintCheck(key_parts=PARTS, dtype="float32", store_url=store_url)
    _, fingerprint = fingerprint_case(check, Endpoint(server.url, request_deadline_s=10), "m", readings=2)
    store = open_store(store_url)
    try:
        store.add(ResultRecord(verdict="pass", stage="done", fingerprint=fingerprint))
    finally:
        store.close()

    def passing_cases(*_: Any, **__: Any) -> SmokeReport:
        return SmokeReport(passed=True, diagnosis="ok", cases=[])

    config = CanaryConfig(
        endpoint=Endpoint(server.url),
        served_name="m",
        cases=[SmokeCase(kind="completion")],
        store=False,
        fingerprint=check,
    )
    canary = Canary(config, runner=passing_cases)
    assert canary.run_once().outcome == "pass"
    server.mode = "drift"
    summary = canary.run_once()
    assert summary.outcome == "wrong" and summary.changed == "corrupt"
    assert "fingerprint: the fingerprint differs from baseline #1" in summary.report.diagnosis


def test_a_canary_with_no_baseline_makes_its_first_healthy_row_the_baseline(
    server: Any, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    check = FingerprintCheck(key_parts=PARTS, dtype="float32", store_url=store_url)

    def passing_cases(*_: Any, **__: Any) -> SmokeReport:
        return SmokeReport(passed=True, diagnosis="ok", cases=[])

    config = CanaryConfig(
        endpoint=Endpoint(server.url),
        served_name="m",
        cases=[SmokeCase(kind="completion")],
        store_url=store_url,
        fingerprint=check,
    )
    canary = Canary(config, runner=passing_cases)
    assert canary.run_once().changed == "healthy"
    store = open_store(store_url)
    try:
        (row,) = store.recent()
        baseline = store.active_baseline(check.key)
    finally:
        store.close()
    assert row.command == "canary" and row.stage == "state:healthy" and row.fingerprint is not None
    assert baseline is not None and baseline.result_id == row.id
    server.mode = "drift"
    assert canary.run_once().outcome == "wrong"
