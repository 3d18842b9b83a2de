"""`deploykit trace --case KIND` is judged before vLLM starts (issue 22, item 8): a case the profile's server
cannot answer (an image for a text-only model, a LoRA case without an adapter) is refused at once, with
its row, instead of after a 40 s start and an HTTP 400."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.profile.load import load_profile
from deploykit.results.sql.store import open_store
from deploykit.serve.stages import StageFailure
from deploykit.trace.run import TraceOptions, run_trace, trace_cases


@pytest.mark.parametrize(("kind", "named"), [("image", "text-only"), ("lora_long", "no LoRA adapter")])
def test_a_case_the_profile_cannot_serve_is_refused(kind: str, named: str) -> None:
    profile = load_profile("demo-cpu").profile
    with pytest.raises(StageFailure, match=named) as caught:
        trace_cases(profile, kind, None, None)
    assert caught.value.stage == "cases" and f"--case {kind}" in str(caught.value)


def test_cases_the_profile_serves_are_kept() -> None:
    profile = load_profile("demo-cpu").profile
    assert [c.kind for c in trace_cases(profile, "chat", None, 4)] == ["chat"]
    assert trace_cases(profile, "penalties", None, None)[0].kind == "penalties"


def test_trace_refuses_before_vllm_starts(tmp_path: Path) -> None:
    said: list[str] = []
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    started = time.monotonic()
    code, report = run_trace(
        TraceOptions(profile="demo-cpu", case="image", store_url=store_url, log_dir=tmp_path / "logs"),
        said.append,
    )
    assert time.monotonic() - started < 10  # no vLLM start (40 s and more)
    assert (code, report) == (exit_codes.USAGE, None)
    assert not (tmp_path / "logs").exists()
    store = open_store(store_url)
    try:
        (record,) = store.recent(limit=5)
    finally:
        store.close()
    assert (record.command, record.verdict, record.stage) == ("trace", "error", "cases")
    assert "text-only" in record.diagnosis
    assert [line for line in said if line.startswith("verdict:")] == [
        f"verdict: ERROR (cases): {record.diagnosis}"
    ]
