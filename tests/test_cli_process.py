"""The forked command line (tests/cli_process.py) answers as a fresh `python -m deploykit` does: the same exit
status, stdout and stderr, with the working directory, environment and stdin it is given, and nothing of one
command left for the next."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli_process import ForkedProcess, run_deploykit, run_python, start_python
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


# --- start_python: a Python child as subprocess.Popen starts one -----------------------------------------

ECHO = """
import os, sys
print(sys.argv[1:], repr(sys.path[0]), os.getcwd(), os.environ.get("DK_MARK"), __name__)
print(sys.stdin.read().upper(), end="")
print("to stderr", file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("forked", [True, False], ids=["forked", "fresh"])
def test_a_python_child_sees_what_a_fresh_one_sees(forked: bool, tmp_path: Path) -> None:
    """`-c code args`: the same argv, sys.path[0], cwd, environment, `__main__`, stdin, stdout and stderr
    (together under STDOUT), and exit status, forked or fresh (a PYTHON* variable forces a fresh one)."""
    env = {**os.environ, "DK_MARK": "marked"}
    if not forked:
        env["PYTHONDONTWRITEBYTECODE"] = "1" if os.environ.get("PYTHONDONTWRITEBYTECODE") != "1" else ""
    process = start_python(
        ["-c", ECHO, "3", "b c"],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert isinstance(process, ForkedProcess) is forked
    with process:
        out, err = process.communicate("shout\n", timeout=60)
    assert err is None and process.returncode == 3
    assert out.splitlines() == [f"['3', 'b c'] '' {tmp_path} marked __main__", "SHOUT", "to stderr"]


def test_a_forked_module_runs_as_main_with_its_file_first(tmp_path: Path) -> None:
    result = run_python(["-m", "json.tool", "--compact"], input='{"a": [1, 2]}', cwd=tmp_path)
    assert (result.returncode, result.stdout) == (0, '{"a":[1,2]}\n')


def test_a_forked_child_is_signalled_polled_and_waited_for_by_its_pid(tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    code = f"import pathlib, time; pathlib.Path({str(ready)!r}).touch(); time.sleep(60)"
    process = start_python(["-c", code], stdout=subprocess.PIPE, text=True)
    assert isinstance(process, ForkedProcess)
    with process:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=0.05)
        os.kill(process.pid, 0)  # the pid is the child's own: a signal reaches it
        process.terminate()
        assert process.wait(timeout=30) == -signal.SIGTERM
        assert process.poll() == -signal.SIGTERM
        process.kill()  # after the end: nothing, as Popen


def test_an_interpreter_flag_starts_a_fresh_interpreter() -> None:
    """-S (no site-packages: the pod's probes) acts when an interpreter starts."""
    process = start_python(["-S", "-c", "import sys; print(sys.flags.no_site)"], stdout=subprocess.PIPE)
    assert not isinstance(process, ForkedProcess)
    with process:
        out, _ = process.communicate(timeout=60)
    assert out.strip() == b"1"
