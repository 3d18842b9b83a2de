"""Render fixtures: probe facts of a real Turing and a real Hopper card, profile variants, the CLI as a
subprocess (what a person runs)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from deploykit.probe.facts import GpuFacts, ProbeFacts
from tests.cli_process import run_deploykit
from tests.profile_variants import profile_variant


def _gpu(index: int, name: str, cc: tuple[int, int], arch: str, memory_mib: int) -> GpuFacts:
    return GpuFacts(
        index=index,
        name=name,
        compute_capability=f"{cc[0]}.{cc[1]}",
        compute_capability_tuple=cc,
        arch=arch,
        bf16_native=cc >= (8, 0),
        fp8_native=cc >= (8, 9),
        is_hopper=cc[0] == 9,
        memory_total_mib=memory_mib,
        mig_mode="disabled",
    )


def _facts(gpus: list[GpuFacts]) -> ProbeFacts:
    return ProbeFacts(
        driver_version="550.54.15", cuda_driver_version="12.4", vllm_version="0.33.0", gpus=gpus
    )


@pytest.fixture(scope="session")
def turing_facts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two Tesla T4 (CC 7.5, 15 GiB), as `deploykit probe --save` writes them."""
    path = tmp_path_factory.mktemp("facts") / "t4.json"
    facts = _facts([_gpu(i, "Tesla T4", (7, 5), "turing", 15360) for i in range(2)])
    path.write_text(facts.model_dump_json(indent=2))
    return path


@pytest.fixture(scope="session")
def hopper_facts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One H100 80GB HBM3 (CC 9.0)."""
    path = tmp_path_factory.mktemp("facts") / "h100.json"
    path.write_text(_facts([_gpu(0, "NVIDIA H100 80GB HBM3", (9, 0), "hopper", 81559)]).model_dump_json())
    return path


@pytest.fixture
def make_profile(tmp_path: Path) -> Callable[[str, dict[str, Any]], Path]:
    return lambda base, changes: profile_variant(tmp_path, base, changes)


def deploykit(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = run_deploykit(args)
    if check and result.returncode != 0:
        raise AssertionError(f"deploykit {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def planned(profile: Path | str, facts: Path) -> dict[str, Any]:
    result = deploykit(
        "plan", "--profile", str(profile), "--facts", str(facts), "--format", "json", "--no-validate"
    )
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan
