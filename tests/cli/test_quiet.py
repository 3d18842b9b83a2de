"""A command prints deploykit's lines and nothing else.

deploykit's own stderr lines start with "deploykit" (`deploykit: ...`, `deploykit plan: warning: ...`);
anything else there is a library's chatter or interpreter-exit noise (nanobind's leak report), which a
person cannot tell from deploykit's lines. Each command runs as a user runs it: the console script.
`deploykit serve` keeps vLLM's log in its file unless asked (`--verbose`), and a command that goes quiet
for more than a second says what it is doing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploykit.vllm_args import vllm_importable
from tests.unit_prefix import ABSENT_PREFIX

REPO = Path(__file__).resolve().parents[2]
DEPLOYKIT = Path(sys.executable).with_name("deploykit")
FACTS = REPO / "tests" / "fixtures" / "facts"


def foreign_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if not line.startswith("deploykit")]


@pytest.fixture(scope="module", autouse=True)
def warm_option_table() -> None:
    from deploykit.vllm_options import check_serve_argv

    if vllm_importable():
        check_serve_argv(["vllm", "serve", "/m"])


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--profile", "demo-cpu"],
        ["plan", "--profile", "gemma4-turing", "--facts", str(FACTS / "t4.json")],
        ["render", "helm", "--profile", "gemma4-turing", "--facts", str(FACTS / "t4.json"), "--out", "OUT"],
        [
            *("render", "systemd", "--profile", "demo-cpu", "--facts", str(FACTS / "no-gpu.json")),
            *("--out", "OUT", "--prefix", ABSENT_PREFIX),
        ],
        # `deploykit fixes` imports vLLM to check each fix's target: not in the fast tier.
        pytest.param(["fixes"], marks=pytest.mark.vllm_import),
        pytest.param(["fixes", "--format", "json"], marks=pytest.mark.vllm_import),
    ],
    ids=["plan", "plan-t4-facts", "render-helm", "render-systemd", "fixes", "fixes-json"],
)
def test_stderr_holds_only_deploykits_lines(argv: list[str], tmp_path: Path) -> None:
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    result = subprocess.run(
        [str(DEPLOYKIT), *argv], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )

    assert result.returncode == 0, result.stderr[-2000:]
    assert foreign_lines(result.stderr) == [], result.stderr[-3000:]
    if argv[0] == "fixes":  # it imports vLLM: seconds of silence otherwise
        assert "deploykit fixes: importing vLLM to check each fix's target ..." in result.stderr.splitlines()


@pytest.mark.vllm_import
def test_the_check_can_fail() -> None:
    """vLLM imported in a process prints its own lines, which the check above would catch."""
    if not vllm_importable():
        pytest.skip("vLLM is not installed")
    result = subprocess.run(
        [sys.executable, "-c", "import gc, vllm.triton_utils; gc.freeze()"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert foreign_lines(result.stderr)


# --- a slow command says what it is doing ---------------------------------------------------------------


def test_a_block_slower_than_a_second_says_what_it_does_once(capsys: pytest.CaptureFixture[str]) -> None:
    from deploykit.cli.progress import say_if_slow

    with say_if_slow("deploykit plan: planning ...", after_s=0.2):
        time.sleep(0.6)
    time.sleep(0.2)  # nothing more comes later

    assert capsys.readouterr().err == "deploykit plan: planning ...\n"


def test_a_quick_block_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    from deploykit.cli.progress import say_if_slow

    with say_if_slow("deploykit plan: planning ...", after_s=0.3):
        pass
    time.sleep(0.6)  # past the timer: it was cancelled, not merely late

    assert capsys.readouterr().err == ""


# --- the terminal during `deploykit serve` --------------------------------------------------------------


def test_the_console_keeps_vllms_lines_unless_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    from deploykit.serve.console import ConsoleUI

    ConsoleUI().log_lines(["(APIServer pid=1) INFO: Started server process"])
    assert capsys.readouterr().err == ""
    ConsoleUI(quiet=False).log_lines(["(APIServer pid=1) INFO: Started server process"])
    assert capsys.readouterr().err == "(APIServer pid=1) INFO: Started server process\n"


def test_without_a_terminal_a_quick_start_prints_no_progress_and_a_slow_one_a_line_a_minute(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from deploykit.serve.console import ConsoleUI

    ui = ConsoleUI()
    for second in range(0, 8):
        ui.progress(second, "loading weights")
    assert capsys.readouterr().err == ""
    for second in range(8, 140):
        ui.progress(second, "loading weights")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[:4] for line in lines] == [
        ["starting", "vLLM:", seconds, "s"] for seconds in ("10", "70", "130")
    ]
    assert all(line.endswith("loading weights") for line in lines)


@pytest.mark.e2e
@pytest.mark.parametrize("verbose", [False, True], ids=["default", "verbose"])
def test_serve_keeps_vllms_log_in_its_file_unless_verbose(tmp_path: Path, verbose: bool) -> None:
    """A vLLM that fails its start (no such model): cheap, and it still writes dozens of log lines."""
    from deploykit.net import free_port
    from tests.profile_variants import profile_variant
    from tests.serve_helpers import CommandRun

    profile = profile_variant(
        tmp_path, "demo-cpu", {"name": "no-model", "model.source": str(tmp_path / "no-such-model")}
    )
    logs = tmp_path / "logs"
    args = ["serve", "--profile", str(profile), "--check", "--port", str(free_port()), "--log-dir", str(logs)]
    args += ["--store", f"sqlite:///{tmp_path / 'results.sqlite'}", *(["--verbose"] if verbose else [])]
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    run = CommandRun(args, env)
    try:
        assert run.finish(600) == 1, run.tail()
    finally:
        run.kill_everything()

    (log_path,) = logs.glob("*.log")
    log = [line for line in log_path.read_text().splitlines() if line.strip()]
    assert len(log) > 20, log
    assert f"log {log_path}" in run.output  # where the whole log is
    assert "vLLM exited during start-up with code" in run.output and "last log lines:" in run.output
    on_terminal = [line for line in log if line in run.lines]
    if verbose:
        assert len(on_terminal) == len(log), set(log) - set(on_terminal)
    else:
        assert 0 < len(on_terminal) <= 12, on_terminal  # only the failure's last lines
