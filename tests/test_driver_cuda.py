"""The node's driver against the target vLLM wheel's CUDA (issue 34), from recorded NVML facts
(tests/fixtures/facts: t4.json a 460 driver, a100.json a 470 one, h100.json 535, b200.json 580)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from deploykit.driver_cuda import check_driver, driver_warning, with_driver_expression
from deploykit.probe.facts import ProbeFacts

FACTS = Path(__file__).resolve().parent / "fixtures" / "facts"


def facts(name: str) -> ProbeFacts:
    return ProbeFacts.model_validate(json.loads((FACTS / name).read_text()))


@pytest.mark.parametrize(
    ("name", "status"),
    [("t4.json", "too-old"), ("a100.json", "too-old"), ("h100.json", "minor-compat"), ("b200.json", "ok")],
)
def test_recorded_drivers_against_a_vllm_033_wheel(name: str, status: str) -> None:
    found = facts(name)
    assert check_driver(found.driver_version, found.cuda_driver_version, "0.33.0").status == status


def test_plan_warns_for_a_460_driver_in_one_line_and_not_for_a_cpu_profile() -> None:
    warning = driver_warning(facts("t4.json"), "0.33.0", "cuda")
    assert warning is not None and "\n" not in warning
    assert "460.32.03 (CUDA up to 11.2) cannot run vLLM 0.33.0's wheel, built with CUDA 12.9" in warning
    assert "branch 525 or newer" in warning
    assert driver_warning(facts("t4.json"), "0.33.0", "cpu") is None
    assert driver_warning(facts("h100.json"), "0.33.0", "cuda") is None  # minor-version compatibility
    assert driver_warning(facts("t4.json"), "0.99.0", "cuda") is None  # a wheel whose CUDA is not known


def test_the_chart_terms_ask_for_a_driver_branch_that_runs_the_wheel() -> None:
    terms = [
        {"matchExpressions": [{"key": "nvidia.com/gpu.compute.major", "operator": "In", "values": ["9"]}]}
    ]
    (term,) = with_driver_expression(terms, "0.33.0")
    assert term["matchExpressions"][-1] == {
        "key": "nvidia.com/cuda.driver-version.major",
        "operator": "Gt",
        "values": ["524"],
    }
    assert with_driver_expression(terms, "0.32.0+cpu") == terms
    assert with_driver_expression([], "0.33.0") == []


def test_the_plan_command_warns(tmp_path: Path) -> None:
    from tests.cli_process import run_deploykit

    repo = Path(__file__).resolve().parents[1]
    profile = str(repo / "profiles" / "gemma4-turing.yaml")
    result = run_deploykit(["plan", "--profile", profile, "--facts", str(FACTS / "t4.json")], cwd=repo)
    assert "driver 460.32.03 (CUDA up to 11.2) cannot run vLLM" in result.stdout + result.stderr
