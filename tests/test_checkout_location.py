"""The suite passes wherever the checkout lies (issue 43): the render tests, run from a checkout under /tmp,
which the rendered units' sandbox hides (`PrivateTmp=yes`, as `ProtectHome=yes` hides /root and /home).

Most people clone under their home directory or /tmp. `render systemd` rightly refuses a prefix the unit's
sandbox hides, and the render tests once passed the checkout's own `.venv` (or let the command default to it),
so they failed in every such clone and passed only where CI happened to clone. They now render with a
prefix of their own (tests/unit_prefix.py). This runs them again from this very checkout mounted under
`tmp_path` (a bind mount in a mount namespace of its own: the same files, the venv reached through the hidden
path, so `sys.prefix` lies under /tmp exactly as in such a clone).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm_harness import REPO

# The render tests that once took the checkout's environment as the units' prefix.
RENDER_TESTS = [
    "tests/render/test_systemd.py",
    "tests/render/test_systemd_canary.py",
    "tests/render/test_render_refusals.py",
    "tests/render/test_templates.py",
    "tests/advisories/test_plan_outputs.py::test_render_writes_the_advisory_into_the_unit_and_the_chart",
    "tests/cli/test_quiet.py::test_stderr_holds_only_deploykits_lines[render-systemd]",
    "tests/cli/test_bad_input.py::test_bad_input_is_one_clear_line[render-out-is-a-file]",
]


def test_the_render_tests_pass_from_a_checkout_under_tmp(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        pytest.skip("needs root and unshare(1) to mount the checkout under a hidden path")
    hidden = tmp_path / "checkout"
    hidden.mkdir()
    interpreter = Path(sys.executable)
    if interpreter.is_relative_to(REPO):  # the checkout's own .venv: reach it through the hidden path
        interpreter = hidden / interpreter.relative_to(REPO)
    pytest_argv = [str(interpreter), "-m", "pytest", "-p", "no:cacheprovider", "--fast"]
    pytest_argv += ["--basetemp", str(tmp_path / "inner"), *RENDER_TESTS]
    script = (
        f"mount --bind {shlex.quote(str(REPO))} {shlex.quote(str(hidden))} && cd {shlex.quote(str(hidden))}"
    )
    script += f" && exec {shlex.join(pytest_argv)}"
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    done = subprocess.run(
        [unshare, "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert f"rootdir: {hidden}" in done.stdout  # the tests ran from the hidden checkout
    assert " passed" in done.stdout and " failed" not in done.stdout and " error" not in done.stdout
