"""`deploykit trace` stopped by SIGTERM at each of its stages stores exactly one row, `interrupted` at that
stage, and exits 128 + 15: a real `deploykit trace` process, a real signal from outside.

The process is held at the stage by a wrapper that pauses the one driver right after it enters the stage
(`StageClock.enter`, serve/driver.py) and says so in a marker file; the test then sends SIGTERM. Nothing
depends on timing: the signal comes while the process sleeps in the pause. The stages before vLLM starts
run here in the quick tier; those with a running vLLM (startup, requests, stop, report) start the CPU build.
"""

from __future__ import annotations

import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from deploykit.argv import value_or
from deploykit.net import port_in_use
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from tests.cli_process import start_python
from tests.trace.models import write_profile

_PAUSING_TRACE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path

    import deploykit.serve.stages as stages
    from deploykit.serve import driver

    stage, marker = sys.argv[1], Path(sys.argv[2])

    def pause() -> None:
        marker.write_text(stage)
        while True:  # until the test's SIGTERM
            time.sleep(0.05)

    if stage == "profile":  # the first stage is where an attempt starts, not one it enters
        load = stages.load
        stages.load = lambda reference: (pause(), load(reference))[1]
    else:
        enter = driver.StageClock.enter

        def pausing(self, to):
            enter(self, to)
            if to.value == stage:
                pause()

        driver.StageClock.enter = pausing
    from deploykit.cli import main

    sys.argv = ["deploykit", "trace", *sys.argv[3:]]
    main()
    """
)
BEFORE_VLLM = ["profile", "cases", "probe", "plan", "secrets", "model", "launch"]
WITH_VLLM = ["startup", "requests", "stop", "report"]


def _trace_stopped_at(
    stage: str, profile: Path, tmp_path: Path, deadline_s: float, *trace_args: str
) -> ResultRecord:
    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    marker = tmp_path / "at-stage"
    env = {**os.environ, "DEPLOYKIT_LOG_DIR": str(tmp_path / "logs")}
    command = ["-c", _PAUSING_TRACE, stage, str(marker), "--profile", str(profile), *trace_args]
    process = start_python(  # forked from a warm interpreter (tests/cli_process.py): a process of its own
        [*command, "--store", store], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + deadline_s
        while not marker.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"the trace never reached {stage}"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 128 + signal.SIGTERM, err
    opened = open_store(store)
    try:
        rows = opened.recent(limit=10)
    finally:
        opened.close()
    assert len(rows) == 1, rows
    (row,) = rows
    assert (row.command, row.verdict, row.stage) == ("trace", "interrupted", stage), row
    assert row.diagnosis == f"stopped by SIGTERM during {stage}"
    assert row.timings["signal"] == signal.SIGTERM and f"stage_{stage}_s" in row.timings
    assert err.count("verdict: INTERRUPTED") == 1 and "Traceback" not in err, err
    return row


@pytest.mark.parametrize("stage", BEFORE_VLLM)
def test_sigterm_before_vllm_starts_stores_one_interrupted_row(stage: str, tmp_path: Path) -> None:
    # A model directory that need not load: these stages end before vLLM starts.
    profile = write_profile(tmp_path, f"sig-{stage}", tmp_path / "no-model")
    _trace_stopped_at(stage, profile, tmp_path, deadline_s=60)


@pytest.mark.vllm_server
@pytest.mark.parametrize("stage", WITH_VLLM)
def test_sigterm_with_vllm_running_stores_one_interrupted_row_and_stops_it(
    stage: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    profile = write_profile(tmp_path, f"sig-{stage}", tiny_model_dir)
    # One short case: the stages after `requests` are what is tested, not how many requests it makes.
    row = _trace_stopped_at(stage, profile, tmp_path, 600, "--case", "completion", "--max-tokens", "2")
    assert row.plan is not None
    port = int(value_or(row.plan["argv"], "--port", "0"))
    assert not port_in_use(port, "127.0.0.1"), "the trace's vLLM outlived it"


def test_an_unexpected_exception_is_one_error_row_too(tmp_path: Path) -> None:
    """`--log-dir` is a file: making the trace directory raises OSError, which used to leave no row."""
    from deploykit import exit_codes
    from deploykit.trace.run import TraceOptions, run_trace

    store = f"sqlite:///{tmp_path / 'results.sqlite'}"
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    said: list[str] = []
    profile = write_profile(tmp_path, "oserror", tmp_path / "no-model")
    code, report = run_trace(
        TraceOptions(profile=str(profile), store_url=store, log_dir=not_a_dir), said.append
    )
    assert (code, report) == (exit_codes.FAILED, None)
    opened = open_store(store)
    try:
        (row,) = opened.recent(limit=10)
    finally:
        opened.close()
    assert (row.verdict, row.stage) == ("error", "secrets")
    assert row.diagnosis.startswith("NotADirectoryError") or row.diagnosis.startswith("FileExistsError")
    assert sum(line.startswith("verdict: ERROR (secrets)") for line in said) == 1
