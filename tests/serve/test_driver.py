"""The one attempt driver (serve/driver.py): how each way an attempt's stages can end becomes its verdict,
and each stage is timed. Real signals: the driver's gate is the one `forwarded_signals` installs."""

from __future__ import annotations

import os
import signal
import time

import pytest

from deploykit import exit_codes
from deploykit.errors import MissingPackageError
from deploykit.results.record import ResultRecord, Verdict
from deploykit.serve.driver import INPUT_STAGES, Stage, StageClock, drive, exit_code
from deploykit.serve.signals import Interrupted, forwarded_signals
from deploykit.serve.stages import StageFailure


def record() -> ResultRecord:
    return ResultRecord(command="smoke", verdict="error", stage=Stage.PROFILE.value)


def test_a_returning_body_is_its_verdict_and_every_stage_is_timed() -> None:
    row = record()
    clock = StageClock(row)

    def body() -> tuple[Verdict, str]:
        clock.enter(Stage.PLAN)
        clock.enter(Stage.SMOKE)
        return "fail", "a case failed"

    outcome = drive(clock, body)
    assert (outcome.verdict, outcome.diagnosis, row.stage) == ("fail", "a case failed", "done")
    assert {"stage_profile_s", "stage_plan_s", "stage_smoke_s", "stage_done_s"} <= set(row.timings)


@pytest.mark.parametrize(
    ("raised", "verdict", "stage", "diagnosis", "code"),
    [
        (StageFailure(Stage.PLAN, "the plan has errors: x"), "error", "plan", "the plan has errors: x", 2),
        (StageFailure(Stage.LAUNCH, "no vllm"), "error", "launch", "no vllm", 1),
        (OSError(28, "No space left on device"), "error", "smoke", "OSError: [Errno 28] No space", 1),
        (MissingPackageError("nvidia-ml-py", "probing"), "error", "smoke", "probing needs", 1),
        (KeyboardInterrupt(), "interrupted", "smoke", "stopped by SIGINT during smoke", 130),
    ],
)
def test_whatever_ends_the_stages_is_the_row(
    raised: BaseException, verdict: str, stage: str, diagnosis: str, code: int
) -> None:
    row = record()
    clock = StageClock(row)

    def body() -> tuple[Verdict, str]:
        clock.enter(Stage.SMOKE)
        raise raised

    outcome = drive(clock, body, usage_stages=INPUT_STAGES)
    row.verdict = outcome.verdict
    assert (outcome.verdict, row.stage) == (verdict, stage)
    assert outcome.diagnosis.startswith(diagnosis)
    assert exit_code(row, outcome) == code
    assert (outcome.error is not None) == isinstance(raised, MissingPackageError)


def test_a_real_sigterm_is_the_row_even_when_a_library_swallows_it() -> None:
    row = record()
    clock = StageClock(row)

    def body() -> tuple[Verdict, str]:
        clock.enter(Stage.REQUESTS)
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises Interrupted here
        except Exception:  # a client library catching everything
            pass
        return "pass", "all cases passed"

    with forwarded_signals() as gate:
        outcome = drive(clock, body, gate=gate)
        assert not gate.armed  # the row and the cleanup are not interrupted again
    row.verdict = outcome.verdict
    assert (outcome.verdict, row.stage) == ("interrupted", "requests")
    assert isinstance(outcome.interrupted, Interrupted)
    assert exit_code(row, outcome, gate) == 128 + signal.SIGTERM
    assert exit_codes.INTERRUPTED == 128 + signal.SIGINT
