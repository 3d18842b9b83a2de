"""The forked command line (tests/cli_process.py) answers as a fresh `python -m deploykit` does: the same exit
status, stdout and stderr, with the working directory, environment and stdin it is given, and nothing of one
command left for the next."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_process import run_deploykit
from tests.vllm_harness import REPO

FACTS = REPO / "tests" / "fixtures" / "facts"


def fresh(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploykit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,  # type: ignore[call-overload]
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["plan", "--profile", "smollm2-cpu", "--facts", str(FACTS / "t4.json")],
        ["plan", "--no-such-option"],
        ["plan", "--profile", "no-such-profile.yaml"],
        ["render", "helm", "--profile"],
    ],
    ids=["help", "plan", "usage-error", "missing-file", "option-without-value"],
)
def test_a_forked_command_answers_as_a_fresh_interpreter(args: list[str]) -> None:
    forked, started = run_deploykit(args, cwd=REPO), fresh(args, cwd=REPO)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        started.returncode,
        started.stdout,
        started.stderr,
    )


def test_the_working_directory_and_environment_are_the_commands_own(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("name: mine\nplatform: cpu\nmodel: {source: /m}\nserve: [\n")
    env = {**os.environ, "COLUMNS": "50", "XDG_CONFIG_HOME": str(tmp_path / "config")}
    forked = run_deploykit(["plan", "--profile", "mine.yaml"], cwd=tmp_path, env=env)
    started = fresh(["plan", "--profile", "mine.yaml"], cwd=tmp_path, env=env)
    assert forked.returncode == started.returncode == 2
    assert forked.stderr == started.stderr and "mine.yaml" in forked.stderr
    # the next command, in another directory, sees neither
    elsewhere = run_deploykit(["plan", "--profile", "mine.yaml"], cwd=REPO)
    assert "mine.yaml:" in elsewhere.stderr and "no such profile file" in elsewhere.stderr


def test_a_python_variable_starts_a_fresh_interpreter() -> None:
    """PYTHONWARNINGS=error acts at an interpreter's start: a forked child would not see it."""
    env = {**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning", "PYTHONPROFILEIMPORTTIME": "1"}
    forked = run_deploykit(["--help"], env=env)
    assert forked.returncode == 0
    assert "import time:" in forked.stderr  # -X importtime's output: the interpreter started anew


def test_a_command_over_its_deadline_is_killed(tmp_path: Path) -> None:
    """A server that takes the connection and never answers: smoke would wait its own 60 s."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        env = {**os.environ, "DEPLOYKIT_STORE": f"sqlite:///{tmp_path / 'r.sqlite'}"}
        started = time.monotonic()
        with pytest.raises(subprocess.TimeoutExpired):
            run_deploykit(["smoke", "--url", url, "--model", "m", "--timeout", "60"], env=env, timeout=2)
        assert time.monotonic() - started < 30
