"""The fast tier (`make check` = `pytest --fast`): what tests/conftest.py reads as slow, and the tier's
collection as a developer runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _COLLECTION_FAILURE, heavy_at_import, needed_for_argv
from tests.vllm_harness import REPO


@pytest.mark.parametrize(
    ("argv", "needed"),
    [
        (["/usr/local/bin/helm", "lint", "--strict", "chart"], ("external_tool", "helm")),
        (["podman", "run", "img"], ("external_tool", "podman")),
        (["systemd-nspawn", "-D", "root", "--boot"], ("external_tool", "systemd-nspawn")),
        ([sys.executable, "-m", "pip", "wheel", "--no-deps", "."], ("wheel_build", "pip wheel")),
        (["pip3", "install", "--target", "t", "x.whl"], ("wheel_build", "pip install")),
        ([sys.executable, "setup.py", "-q", "sdist"], ("wheel_build", "setup.py sdist")),
        ([sys.executable, "-m", "deploykit", "render", "helm", "-p", "demo-cpu"], None),
        ([sys.executable, "-m", "pip", "--version"], None),
        (["systemd-analyze", "verify", "unit.service"], None),
    ],
)
def test_command_lines_that_leave_the_fast_tier(argv: list[str], needed: tuple[str, str] | None) -> None:
    assert needed_for_argv(argv) == needed


def test_a_module_that_imports_vllm_or_torch_when_imported_is_seen_from_its_source(tmp_path: Path) -> None:
    cases = {
        "test_top.py": ("import torch\n", "imports torch"),
        "test_from.py": ("from vllm.v1.sample import sampler\n", "imports vllm.v1.sample"),
        "test_skip.py": ('import pytest\ntorch = pytest.importorskip("torch")\n', "imports torch"),
        "test_marked.py": ("import pytest\npytestmark = pytest.mark.wheel_build\n", "pytestmark wheel_build"),
        "test_inside.py": ("def test_x():\n    import torch\n", ""),
        "test_typing.py": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n", ""),
        "test_plain.py": ("import json\n", ""),
    }
    for name, (source, why) in cases.items():
        (tmp_path / name).write_text(source)
        found = heavy_at_import(tmp_path / name)
        assert (why in found) if why else found == "", (name, found)


def test_a_tests_helper_that_imports_torch_is_followed() -> None:
    # tests/e2e/fault_worker.py imports torch and vLLM at module level; a module importing it does too.
    assert heavy_at_import(REPO / "tests" / "e2e" / "fault_worker.py") == "fault_worker.py imports torch"
    assert heavy_at_import(REPO / "tests" / "e2e" / "test_canary_e2e.py").startswith(
        "test_canary_e2e.py imports tests.e2e.fault_worker"
    )


def test_the_fast_tier_collects_no_e2e_test_and_imports_no_vllm(request: pytest.FixtureRequest) -> None:
    """As `make check` collects: its own guard fails the run if collecting imported vLLM or torch. Inside
    a `--fast` run of the whole tier that collection is this session's own (read, not repeated: a second
    collection of the whole tier was the tier's slowest test); in any other run, a `pytest --fast
    --collect-only` child."""
    config = request.config
    paths = {(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args}
    user_marks = not config.option.markexpr.startswith("not (")  # --fast's own expression, or more
    narrowed = config.option.keyword or config.option.deselect or user_marks
    whole_tier = config.getoption("--fast") and paths <= {REPO, REPO / "tests"} and not narrowed
    if whole_tier:
        failure = request.config.stash.get(_COLLECTION_FAILURE, (None, ""))[1]
        assert failure == ""  # the session's guard: collecting imported neither vLLM nor torch
        collected = [item.nodeid for item in request.session.items]
    else:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--fast", "--collect-only", "-q", "-p", "no:cacheprovider"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=REPO,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        collected = [line for line in result.stdout.splitlines() if "::" in line]
    assert len(collected) > 300
    assert not [n for n in collected if "/e2e/" in n or "_e2e.py" in n]
    assert "tests/test_tiers.py::test_the_fast_tier_collects_no_e2e_test_and_imports_no_vllm" in collected


def test_no_test_outside_tests_e2e_imports_from_it() -> None:
    """tests/e2e/ holds end-to-end tests only; what other tests share with them lives at tests/ level
    (tests/serve_helpers.py, tests/gemma4_models.py), so a fast test never reaches into the slow tier."""
    import ast

    reaching = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if "e2e" in path.relative_to(REPO / "tests").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            reaching += [f"{path.relative_to(REPO)}: {n}" for n in names if n.startswith("tests.e2e")]
    assert reaching == []
