"""The rendered server unit starts vLLM only when the prefix's installed vLLM is the release the plan was
made for (issue 43, item 8): an `ExecStartPre=` run by the prefix's Python, which systemd accepts and which,
run as the unit runs it, exits non-zero with one line on a mismatch and 0 on a match. The unit runs a local
model offline and without vLLM's usage report (item 7), from the plan's env. The chart follows the profile's
release (its image tag) and is not warned."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploykit import exit_codes
from tests.render.conftest import deploykit
from tests.render.test_systemd import render, split_command_line, unit_value, verify
from tests.vllm_harness import REPO

FACTS_DIR = REPO / "tests" / "fixtures" / "facts"
CHECK_MODULE = "deploykit.render.vllm_release"


def release_check(unit_text: str) -> list[str]:
    """The server unit's ExecStartPre= argv (it has exactly one)."""
    return split_command_line(unit_value(unit_text, "ExecStartPre"))


def run_as_the_unit(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """The check as systemd starts it: a clean environment, no terminal, the state directory's stand-in as
    the working directory."""
    return subprocess.run(
        argv, env={"PATH": "/usr/bin:/bin"}, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_the_unit_refuses_another_release_than_the_planned_one(
    make_profile: Callable[[str, dict[str, Any]], Path], turing_facts: Path, tmp_path: Path
) -> None:
    """Planned for 0.33.0 (the facts' host), started where 0.32.0+cpu is installed: refused in one line."""
    profile = make_profile("gemma4-turing", {})
    out = tmp_path / "out"
    files = render(profile, turing_facts, out)
    unit = files["deploykit-gemma4-turing.service"]
    argv = release_check(unit)
    assert argv[1:] == ["-P", "-m", CHECK_MODULE, "--planned", "0.33.0"]
    vllm = Path(split_command_line(unit_value(unit, "ExecStart"))[0])
    assert argv[0] == str(vllm.parent / "python")  # the prefix's own Python, beside the vllm it checks
    server, smoke = out / "deploykit-gemma4-turing.service", out / "deploykit-gemma4-turing-smoke.service"
    assert verify(server, smoke) == ""
    done = run_as_the_unit(argv, tmp_path)
    assert done.returncode == exit_codes.USAGE, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "planned for vLLM 0.33.0" in lines[0] and "0.32.0+cpu" in lines[0], lines[0]


@pytest.mark.parametrize("pinned", [None, "0.32.0"])
def test_the_unit_starts_on_the_planned_release(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path, pinned: str | None
) -> None:
    """Planned on the facts of this host (0.32.0+cpu), or pinned to 0.32.0 (the same release): exit 0."""
    profile = make_profile("demo-cpu", {"vllm_version": pinned})
    out = tmp_path / "out"
    files = render(profile, FACTS_DIR / "no-gpu.json", out)
    argv = release_check(files["deploykit-demo-cpu.service"])
    assert argv[-2:] == ["--planned", pinned or "0.32.0+cpu"]
    assert verify(out / "deploykit-demo-cpu.service", out / "deploykit-demo-cpu-smoke.service") == ""
    done = run_as_the_unit(argv, tmp_path)
    assert done.returncode == exit_codes.OK, done.stdout + done.stderr
    assert done.stdout + done.stderr == ""


def test_a_local_model_unit_runs_offline_and_private(
    make_profile: Callable[[str, dict[str, Any]], Path], turing_facts: Path, tmp_path: Path
) -> None:
    profile = make_profile("gemma4-turing", {"model.source": "/srv/models/gemma"})
    unit = render(profile, turing_facts, tmp_path / "out")["deploykit-gemma4-turing.service"]
    for line in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "DO_NOT_TRACK=1"):
        assert f"\nEnvironment={line}\n" in unit, line
    hub = render(make_profile("qwen-lora-hopper", {}), FACTS_DIR / "h100.json", tmp_path / "hub")
    assert "HF_HUB_OFFLINE" not in hub["deploykit-qwen-lora-hopper.service"]  # a hub id needs the hub


def test_render_warns_for_a_host_and_the_chart_follows_the_profile(
    make_profile: Callable[[str, dict[str, Any]], Path], tmp_path: Path
) -> None:
    profile = make_profile("gemma4-turing", {"vllm_version": "0.34.0"})  # t4.json's host has 0.33.0
    facts = str(FACTS_DIR / "t4.json")
    words = "the profile's vllm_version is 0.34.0, but the saved probe"
    units = deploykit("render", "systemd", "-p", str(profile), "--facts", facts, "--out", str(tmp_path / "u"),
                      "--prefix", "/opt/deploykit-not-here")  # fmt: skip
    assert len([line for line in units.stderr.splitlines() if words in line]) == 1, units.stderr
    chart = deploykit("render", "helm", "-p", str(profile), "--facts", facts, "--out", str(tmp_path / "c"))
    assert "vllm_version" not in chart.stderr, chart.stderr
    [values] = (tmp_path / "c").rglob("values.yaml")
    assert yaml.safe_load(values.read_text())["image"]["tag"] == "v0.34.0"  # the profile's release
