"""`deploykit probe`, `plan` and `render` never import torch or vLLM (or what drags them in).

`plan` validates its argv by default against the installed vLLM's option table, cached per vLLM version
(deploykit.vllm_options); with the cache warm, the default command imports no vLLM either.

Importing vLLM costs ~6 s and torch ~2 s, and a machine that only plans may have neither. Each
command runs as a user runs it (the installed console script, in a subprocess) under
`python -X importtime`, which lists every module the process imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOYKIT = Path(sys.executable).with_name("deploykit")
FACTS = REPO / "tests" / "fixtures" / "facts"
HEAVY = {"torch", "vllm", "transformers", "triton", "tokenizers"}


def imported_modules(argv: list[str]) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Every module a `python -X importtime ...` run imported, and the finished process."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return modules, result


@pytest.fixture(scope="module")
def warm_option_table() -> None:
    """The installed vLLM's option table in the cache (built once, in a child process, when missing)."""
    from deploykit.vllm_args import vllm_importable
    from deploykit.vllm_options import check_serve_argv

    if vllm_importable():
        check_serve_argv(["vllm", "serve", "/m"])


def heavy(modules: set[str]) -> set[str]:
    return {name for name in modules if name.split(".")[0] in HEAVY}


def test_the_import_list_sees_what_a_process_imports() -> None:
    """The check can fail: a process that does import a watched package is caught."""
    modules, _ = imported_modules(["-c", "import tokenizers"])

    assert "tokenizers" in heavy(modules)


@pytest.mark.parametrize(
    ("argv", "ran"),
    [
        (["probe"], "deploykit.probe.nvml_reader"),
        (["probe", "--format", "json"], "deploykit.probe.nvml_reader"),
        (["plan", "--profile", "demo-cpu", "--no-validate"], "deploykit.plan"),
        (
            [
                "plan",
                "--profile",
                "qwen-lora-hopper",
                "--facts",
                str(FACTS / "h100.json"),
                "--no-validate",
                "--format",
                "json",
            ],
            "deploykit.plan",
        ),
        (["profiles", "list", "--facts", str(FACTS / "t4.json")], "deploykit.profile.catalog"),
        (["plan", "--profile", "demo-cpu"], "deploykit.vllm_options"),
        (
            ["plan", "--profile", "qwen-lora-hopper", "--facts", str(FACTS / "h100.json")],
            "deploykit.vllm_options",
        ),
        (
            [
                "render",
                "helm",
                "--profile",
                "gemma4-turing",
                "--facts",
                str(FACTS / "t4.json"),
                "--out",
                "OUT",
            ],
            "deploykit.render.helm",
        ),
    ],
    ids=[
        "probe",
        "probe-json",
        "plan-demo-cpu",
        "plan-h100-facts",
        "profiles-list-t4-facts",
        "plan-demo-cpu-validated",
        "plan-lora-h100-validated",
        "render-helm",
    ],
)
def test_command_never_imports_torch_or_vllm(
    argv: list[str], ran: str, warm_option_table: None, tmp_path: Path
) -> None:
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    modules, result = imported_modules([str(DEPLOYKIT), *argv])

    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert ran in modules  # the command really got as far as its work
    assert heavy(modules) == set()


# Each costs a large share of the probe's 0.3 s budget here (bench/bench_probe.py): pydantic ~0.25 s with
# its first model, importlib.metadata ~0.07 s, rich ~0.05 s.
NOT_FOR_PROBE_JSON = {"pydantic", "importlib.metadata", "rich"}


def test_probe_json_does_without_pydantic_importlib_metadata_and_rich() -> None:
    modules, result = imported_modules([str(DEPLOYKIT), "probe", "--format", "json"])

    assert "deploykit.probe.nvml_reader" in modules and '"schema_version": 1' in result.stdout
    assert modules & NOT_FOR_PROBE_JSON == set()


def test_the_probe_table_does_use_them() -> None:
    """The check above can fail: the table for people validates with pydantic and prints with rich."""
    modules, _ = imported_modules([str(DEPLOYKIT), "probe"])

    assert {"pydantic", "rich"} <= modules
