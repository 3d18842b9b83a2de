"""`deploykit serve` and `deploykit smoke` judge with the profile's `smoke.tie_tolerance` and
`smoke.logprob_tolerance`, as the canary does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from deploykit.endpoint import Endpoint
from deploykit.serve.console import ConsoleUI
from deploykit.serve.options import ServeOptions
from deploykit.serve.remote_smoke import SmokeOptions, run_remote_smoke
from deploykit.serve.stages import Attempt, smoke_attempt
from deploykit.smoke import SmokeReport
from tests.profile_variants import profile_variant


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def fake_run_smoke(endpoint: Endpoint, requests: Any, **kwargs: Any) -> SmokeReport:
        seen.update(kwargs, endpoint=endpoint)
        return SmokeReport(passed=True, diagnosis="ok", cases=[])

    monkeypatch.setattr("deploykit.smoke.client.run_smoke", fake_run_smoke)
    return seen


def tolerant(tmp_path: Path) -> Path:
    # No fingerprint: the faked smoke has no server to probe (tests/smoke/test_fingerprint*.py cover it).
    changes = {
        "name": "tolerant",
        "smoke.tie_tolerance": 0.3,
        "smoke.logprob_tolerance": 0.2,
        "smoke.timeout_s": 45,
        "smoke.fingerprint.enabled": False,
    }
    return profile_variant(tmp_path, "demo-cpu", changes)


def test_smoke_command_passes_the_profiles_tolerances(tmp_path: Path, captured: dict[str, Any]) -> None:
    options = SmokeOptions(url="http://127.0.0.1:1", profile=str(tolerant(tmp_path)), store=False)
    assert run_remote_smoke(options) == 0
    assert (captured["tie_tolerance"], captured["logprob_tolerance"]) == (0.3, 0.2)
    assert captured["endpoint"] == Endpoint("http://127.0.0.1:1", request_deadline_s=45)  # the profile's


def test_smoke_command_without_a_profile_uses_the_defaults(captured: dict[str, Any]) -> None:
    from deploykit.smoke import DEFAULT_LOGPROB_TOLERANCE, DEFAULT_TIE_TOLERANCE

    assert run_remote_smoke(SmokeOptions(url="http://127.0.0.1:1", model="m", store=False)) == 0
    assert (captured["tie_tolerance"], captured["logprob_tolerance"]) == (
        DEFAULT_TIE_TOLERANCE,
        DEFAULT_LOGPROB_TOLERANCE,
    )


def test_serve_smoke_passes_the_profiles_tolerances(tmp_path: Path, captured: dict[str, Any]) -> None:
    from deploykit.profile.load import load_profile

    loaded = load_profile(str(tolerant(tmp_path)))
    attempt = Attempt(
        options=ServeOptions(profile="tolerant"),
        loaded=loaded,
        plan=SimpleNamespace(model_path=None, enabled_fixes=[]),  # type: ignore[arg-type]
        base_url="http://127.0.0.1:1",
    )
    smoke_attempt(attempt, ConsoleUI(quiet=True))
    assert (captured["tie_tolerance"], captured["logprob_tolerance"]) == (0.3, 0.2)
    assert captured["endpoint"].request_deadline_s == 45
