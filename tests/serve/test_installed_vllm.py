"""`deploykit serve` launches only the vLLM release its plan was made for (issue 43, item 8): a profile that
pins another release than the one installed here is refused before any model loads, in one line, exit 2
(a plan refusal: docs/exit-codes.md), and the attempt's row is still stored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.installed import installed_vllm_version
from deploykit.serve import attempt as attempt_module
from deploykit.serve.attempt import run_serve
from deploykit.serve.console import ConsoleUI
from deploykit.serve.options import ServeOptions
from tests.cli_process import run_deploykit
from tests.profile_variants import profile_variant
from tests.serve_helpers import only_row
from tests.vllm_harness import REPO

PINNED = "0.33.0"  # a release this checkout's venv (vLLM 0.32.0+cpu) does not have


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    def tripwire(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model stage was reached: the installed vLLM was checked too late")

    monkeypatch.setattr(attempt_module, "ensure_model", tripwire)


def test_serve_refuses_another_release_and_stores_the_row(tmp_path: Path, no_model_loads: None) -> None:
    installed = installed_vllm_version()
    assert installed is not None and not installed.startswith(PINNED)
    profile = profile_variant(tmp_path, "demo-cpu", {"vllm_version": PINNED})
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    code = run_serve(
        ServeOptions(profile=str(profile), store_url=store_url, log_dir=tmp_path / "logs"),
        ConsoleUI(quiet=True),
    )
    assert code == exit_codes.USAGE
    record = only_row(store_url)
    assert (record.verdict, record.stage) == ("error", "plan"), record.diagnosis
    assert f"vllm_version is {PINNED}" in record.diagnosis and installed in record.diagnosis
    assert record.versions["vllm"] == installed
    assert not (tmp_path / "logs").exists()  # vLLM never started


def test_the_command_says_it_in_one_line(tmp_path: Path) -> None:
    profile = profile_variant(tmp_path, "demo-cpu", {"vllm_version": PINNED})
    env = {**os.environ, "DEPLOYKIT_STORE": f"sqlite:///{tmp_path / 'results.sqlite'}"}
    run = run_deploykit(["serve", "-p", str(profile), "--log-dir", str(tmp_path / "logs")], env=env, cwd=REPO)
    output = run.stdout + run.stderr
    assert run.returncode == exit_codes.USAGE, output
    assert "Traceback" not in output, output
    said = [line for line in output.splitlines() if f"vllm_version is {PINNED}" in line]
    assert len(said) == 1 and said[0].startswith("verdict: ERROR (plan): refused:"), output
    assert "result #1 stored" in output, output
