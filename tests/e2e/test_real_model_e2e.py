"""The real model end to end: SmolLM2-135M-Instruct converted by deploykit and served by `deploykit serve`
(one vLLM for the session: tests/e2e/real_model.py). Answers with meaning, checked by known answers:

1. the start-up smoke passes with the profile's known answers, and shows their text beside their ids;
2. the same known answers with their expectations changed fail `deploykit smoke`, one line each with the
   expected and the got;
3. a canary run of a known answer (the rotation's own requests) passes on the real model.
"""

from __future__ import annotations

import json
import re

import yaml

from deploykit.canary.rotation import case_labels, rotation_for, run_requests
from deploykit.endpoint import Endpoint
from deploykit.profile.load import load_profile
from deploykit.results.sql.store import open_store
from deploykit.smoke import run_smoke, special_token_ids, vocab_size
from tests.e2e.real_model import RealModelServer
from tests.serve_helpers import CommandRun

KNOWN = [
    "known:capital-of-france",
    "known:capital-of-japan",
    "known:counting",
    "known:capital-of-germany-ids",
]


def test_the_start_up_smoke_passes_with_the_real_models_known_answers(
    real_model_server: RealModelServer,
) -> None:
    output = real_model_server.run.output
    verdict = re.search(r"^verdict: PASS \(done\): all (\d+) cases passed \((.*)\)$", output, re.M)
    assert verdict, real_model_server.run.tail()
    assert verdict.group(2).split(", ")[-5:] == [*KNOWN, "fingerprint"]
    # The answer's words beside its ids, as `make demo` shows them.
    assert re.search(
        r"ok   known:capital-of-france .* ids \[.*\]  'The capital of France is Paris\.'", output
    )
    store = open_store(real_model_server.store_url)
    try:
        (row,) = [r for r in store.recent(limit=10) if r.command == "serve"]
    finally:
        store.close()
    cases = {case.name: case for case in row.cases}
    assert row.verdict == "pass" and all(cases[name].passed for name in KNOWN)
    assert "Paris" in (cases["known:capital-of-france"].text or "")
    assert "Tokyo" in (cases["known:capital-of-japan"].text or "")
    assert cases["known:counting"].first_ids == [216, 38, 28, 216, 39, 28]


def test_a_changed_known_answer_fails_with_the_expected_and_the_got(
    real_model_server: RealModelServer,
) -> None:
    data = yaml.safe_load(real_model_server.profile_path.read_text())
    answers = {answer["name"]: answer for answer in data["smoke"]["known_answers"]}
    answers["capital-of-france"]["expect_substring"] = "Lyon"
    answers["counting"]["expect_ids"] = [216, 38, 28, 216, 40, 28]  # " 6, 8,"
    # Only the known answers: no other case, no fingerprint (it needs a store), so the run is two requests.
    data["smoke"] = {
        "timeout_s": data["smoke"]["timeout_s"],
        "cases": [],
        "fingerprint": {"enabled": False},
        "known_answers": [answers["capital-of-france"], answers["counting"]],
    }
    changed = real_model_server.profile_path.with_name("smollm2-changed.yaml")
    changed.write_text(yaml.safe_dump({**data, "name": "smollm2-changed"}, sort_keys=False))
    smoke = CommandRun(
        ["smoke", "--url", real_model_server.base_url, "--profile", str(changed), "--no-store"],
        real_model_server.env,
    )
    assert smoke.finish(300) == 1, smoke.output
    lines = smoke.output.splitlines()
    assert "       expected 'Lyon' in the text, got 'The capital of France is Paris.'" in lines, smoke.output
    assert any(
        line.strip().startswith(
            "expected ids [216, 38, 28, 216, 40, 28] first, got [216, 38, 28, 216, 39, 28]"
        )
        for line in lines
    ), smoke.output
    verdict = next(line for line in lines if line.startswith("verdict: FAIL"))
    assert (
        "known:capital-of-france: expected 'Lyon' in the text, got 'The capital of France is Paris.'"
        in verdict
    )


def test_a_canary_run_of_a_known_answer_passes_on_the_real_model(real_model_server: RealModelServer) -> None:
    profile = load_profile(str(real_model_server.profile_path)).profile
    rotation = rotation_for(profile)
    number = case_labels(rotation).index("known:capital-of-germany-ids")
    requests = run_requests(rotation, number, profile.served_name, None, profile.serve.max_model_len)
    report = run_smoke(
        Endpoint(real_model_server.base_url, request_deadline_s=profile.smoke.timeout_s),
        requests,
        special_ids=special_token_ids(real_model_server.model_dir),
        vocab_size=vocab_size(real_model_server.model_dir),
    )
    assert report.passed, report.diagnosis
    (case,) = report.cases
    assert case.name == "known:capital-of-germany-ids" and case.text == "The capital of Germany is Berlin"
    assert json.dumps(case.first_ids) == "[504, 3575, 282, 4521, 314, 11452]"
