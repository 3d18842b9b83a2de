"""The strict judge (issue 31) against a real vLLM (the CPU build, the tiny model): every answer of every
case kind passes the typed validation and the vocabulary bound, so strictness costs no false alarm; the
same answers fail a bound below the ids the model really emits, so the bound is applied."""

from __future__ import annotations

from pathlib import Path

from deploykit.endpoint import Endpoint
from deploykit.profile.schema import CONSISTENCY_KINDS, SmokeCase
from deploykit.smoke import run_smoke, smoke_requests, special_token_ids, vocab_size
from tests.vllm_harness import RunningServer


def test_real_answers_pass_the_strict_judge_within_the_models_vocabulary(
    tiny_vllm: RunningServer, tiny_model_dir: Path
) -> None:
    requests = smoke_requests(
        [SmokeCase(kind=kind) for kind in ("completion", "chat", *CONSISTENCY_KINDS)], tiny_vllm.served_name
    )
    vocab = vocab_size(tiny_model_dir)
    assert vocab is not None
    endpoint = Endpoint(tiny_vllm.base_url, request_deadline_s=120)
    report = run_smoke(
        endpoint,
        requests,
        special_ids=special_token_ids(tiny_model_dir),
        vocab_size=vocab,
    )
    assert report.passed, report.diagnosis
    highest = max(report.cases[0].first_ids)  # the completion case's, all of them (a few tokens)
    tight = run_smoke(endpoint, requests[:1], vocab_size=highest)
    assert not tight.passed and "impossible" in tight.diagnosis
