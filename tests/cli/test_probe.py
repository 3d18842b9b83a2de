"""`deploykit probe` as a user runs it: the real command in a subprocess on this GPU-less machine, and
the same command in-process against the fake NVML for the cases this machine cannot show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml
import pytest

import deploykit.probe.load
import deploykit.probe.nvml_reader
from deploykit.cli import app
from deploykit.exit_codes import NO_GPU
from tests.cli_runner import CliRunner
from tests.fakes.fake_nvml import CONTRACT_KEYS, FakeNvml, load_gpu_fixture

DEPLOYKIT = Path(sys.executable).with_name("deploykit")


def _machine_has_nvml() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


no_gpu_here = pytest.mark.skipif(_machine_has_nvml(), reason="this machine has an NVIDIA driver")


def run_deploykit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(DEPLOYKIT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def assert_one_clear_line(stderr: str) -> None:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("deploykit probe: NVML could not start: "), lines[0]
    assert "libnvidia-ml.so.1" in lines[0]
    assert "Traceback" not in stderr


@no_gpu_here
def test_probe_table_without_gpu_exits_no_gpu_with_one_clear_line() -> None:
    result = run_deploykit("probe")

    assert result.returncode == NO_GPU
    assert_one_clear_line(result.stderr)
    assert "driver -" in result.stdout  # the host line still tells what is installed
    assert "vllm " in result.stdout and "torch " in result.stdout


@no_gpu_here
def test_probe_json_without_gpu_is_still_the_json_contract() -> None:
    result = run_deploykit("probe", "--format", "json")

    assert result.returncode == NO_GPU
    assert_one_clear_line(result.stderr)
    data = json.loads(result.stdout)
    assert set(data) >= CONTRACT_KEYS
    assert data["gpus"] == []
    assert data["error"] and "libnvidia-ml.so.1" in data["error"]
    assert data["schema_version"] == 1
    assert data["driver_version"] is None
    # Versions come from package metadata; this machine has the CPU build installed.
    assert data["vllm_version"] and "cpu" in data["vllm_version"]
    assert data["torch_version"]


@no_gpu_here
def test_probe_save_writes_the_json_it_prints(tmp_path: Path) -> None:
    saved = tmp_path / "facts.json"

    result = run_deploykit("probe", "--format", "json", "--save", str(saved))

    assert result.returncode == NO_GPU
    assert json.loads(saved.read_text()) == json.loads(result.stdout)
    loaded = deploykit.probe.load.load_facts(str(saved))
    assert loaded.gpus == [] and loaded.error == json.loads(result.stdout)["error"]


def test_probe_help_is_clear() -> None:
    result = run_deploykit("probe", "--help")

    assert result.returncode == 0
    for text in ("NVML", "--format", "json", "--save"):
        assert text in result.stdout


# -- in-process, with the fake NVML in place of pynvml ------------------------------------


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml.from_fixture(load_gpu_fixture("h100"), count=2)
    monkeypatch.setattr(deploykit.probe.nvml_reader, "_nvml_module", lambda: fake)
    return fake


def test_probe_json_with_gpus_exits_0(fake_nvml: FakeNvml) -> None:
    result = CliRunner().invoke(app, ["probe", "--format", "json"])

    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    data = json.loads(result.stdout)
    assert data["error"] is None
    assert [g["name"] for g in data["gpus"]] == ["NVIDIA H100 80GB HBM3"] * 2
    assert data["gpus"][0]["is_hopper"] is True
    assert data["gpus"][0]["compute_capability"] == "9.0"


def test_probe_table_with_gpus(fake_nvml: FakeNvml) -> None:
    result = CliRunner(env={"COLUMNS": "200"}).invoke(app, ["probe"])

    assert result.exit_code == 0, result.output
    assert "NVIDIA H100 80GB HBM3" in result.stdout
    assert "hopper" in result.stdout
    assert "535.129.03" in result.stdout


def test_probe_with_a_lost_gpu_exits_no_gpu_naming_it(fake_nvml: FakeNvml) -> None:
    fake_nvml.lost = {1: "nvmlDeviceGetMemoryInfo"}

    result = CliRunner().invoke(app, ["probe", "--format", "json"])

    assert result.exit_code == NO_GPU
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("deploykit probe: GPU 1 stopped answering")
    data = json.loads(result.stdout)
    assert len(data["gpus"]) == 2 and data["gpus"][1]["memory_total_mib"] is None
