"""The field's failure on the real vLLM CPU build: one long prompt breaks the server for good.

`tests.e2e.fault_worker.FaultWorker` (loaded with `--worker-cls`) makes every forward pass after one step
of more than 400 real tokens return NaN, while HTTP says 200 and `/health` stays healthy. Today's short
default cases (completion, chat) pass on it; the consistency defaults (`repeat`, `long_then_short`) fail
and say why. One vLLM start (30–60 s on a 2-core box).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from deploykit.endpoint import Endpoint
from deploykit.profile.load import load_profile
from deploykit.profile.schema import SmokeCase
from deploykit.smoke import derive_cases, run_smoke, smoke_requests, special_token_ids
from tests.e2e.fault_worker import TOKENS_ENV, WORKER_CLS
from tests.vllm_harness import REPO, RunningServer, running_vllm, tiny_serve_args

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def faulty(tiny_model_dir: Path) -> Iterator[RunningServer]:
    env = {"PYTHONPATH": str(REPO), TOKENS_ENV: "400"}
    with running_vllm([*tiny_serve_args(tiny_model_dir), "--worker-cls", WORKER_CLS], env=env) as server:
        yield server


def test_short_defaults_pass_and_consistency_defaults_catch_the_long_prompt(
    faulty: RunningServer, tiny_model_dir: Path
) -> None:
    special = special_token_ids(tiny_model_dir)
    endpoint = Endpoint(faulty.base_url, request_deadline_s=180)
    # Today's defaults: short prompts only. The broken server passes them, twice.
    today = smoke_requests([SmokeCase(kind="completion"), SmokeCase(kind="chat")], "tiny")
    for _ in range(2):
        report = run_smoke(endpoint, today, special_ids=special)
        assert report.passed, report.diagnosis
        assert report.diagnosis == "all 2 cases passed (completion, chat)"

    # The new defaults of the demo profile: completion, chat, repeat, long_then_short (512 tokens).
    profile = load_profile("demo-cpu").profile
    cases = derive_cases(profile)
    assert [c.kind for c in cases] == ["completion", "chat", "repeat", "long_then_short"]
    requests = smoke_requests(cases, "tiny", max_model_len=profile.serve.max_model_len)
    report = run_smoke(endpoint, requests, special_ids=special)
    by_name = {case.name: case for case in report.cases}
    assert not report.passed
    # Everything before the long prompt is right, including the baseline of long_then_short.
    for name in ("completion", "chat", "repeat:1", "repeat:2", "long_then_short:short"):
        assert by_name[name].passed, by_name[name].diagnosis
    assert len(next(r for r in requests if r.name == "long_then_short:long").body["prompt"]) == 512
    again = by_name["long_then_short:again"]
    assert not again.passed and not again.miss
    assert "NaN or infinite" in again.diagnosis
    assert "the short prompt again after the long one: long_then_short:short had a good answer before" in (
        again.diagnosis
    )
    assert "long_then_short:again:" in report.diagnosis

    # The process is up and says it is healthy; without logprobs the answer is HTTP 200 and token 0.
    with httpx.Client(base_url=faulty.base_url, timeout=60) as client:
        assert client.get("/health").status_code == 200
    assert faulty.completion_ids("Once upon a time there was", max_tokens=6) == [0] * 6
    # ... and today's short defaults now fail too: the corruption is for good.
    after = run_smoke(endpoint, today, special_ids=special)
    assert not after.passed and all(not case.miss for case in after.cases)
