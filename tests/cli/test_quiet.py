"""A command prints deploykit's lines and nothing else.

deploykit's own stderr lines start with "deploykit" (`deploykit: ...`, `deploykit plan: warning: ...`);
anything else there is a library's chatter or interpreter-exit noise (nanobind's leak report), which a
person cannot tell from deploykit's lines. Each command runs as a user runs it: the console script.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploykit.vllm_args import vllm_importable

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
        ["render", "systemd", "--profile", "demo-cpu", "--facts", str(FACTS / "no-gpu.json"), "--out", "OUT"],
        ["fixes"],
        ["fixes", "--format", "json"],
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
