"""`deploykit render` refuses, in one line and a non-zero exit, what could never run where the facts say it
lands (issue 34): a profile whose `requires` fail (a Hopper-only profile on an A100, tensor parallelism 16
on 8 GPUs, which a pod would ask as `nvidia.com/gpu: 16` and stay Pending for ever); `--force` renders it
anyway, with a warning."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli_process import run_deploykit
from tests.profile_variants import PROFILES, profile_variant
from tests.unit_prefix import ABSENT_PREFIX
from tests.vllm_harness import REPO

FACTS = REPO / "tests" / "fixtures" / "facts"


def render(kind: str, profile: Path, facts: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["render", kind, "--profile", str(profile), "--facts", str(FACTS / facts), "--out", str(out)]
    args += [*extra, *(["--prefix", ABSENT_PREFIX] if kind == "systemd" else [])]
    return run_deploykit(args, timeout=180, cwd=REPO)


@pytest.mark.parametrize("kind", ["helm", "systemd"])
def test_a_hopper_profile_on_an_a100_is_refused_and_force_renders_it(kind: str, tmp_path: Path) -> None:
    refused = render(kind, PROFILES / "qwen-lora-hopper.yaml", "a100.json", tmp_path / "refused")
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith(f"deploykit: render {kind}: the profile's requires fail for these facts: GPU 0")
    assert "architecture ampere not in hopper" in line and "--force" in line
    assert not (tmp_path / "refused").exists()  # nothing written
    forced = render(kind, PROFILES / "qwen-lora-hopper.yaml", "a100.json", tmp_path / "forced", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "rendered anyway (--force)" in forced.stderr


def test_tensor_parallel_16_on_8_gpus_is_refused(tmp_path: Path) -> None:
    profile = profile_variant(tmp_path, "qwen-lora-hopper", {"serve.tensor_parallel_size": 16})
    refused = render("helm", profile, "h100x8.json", tmp_path / "out")
    assert refused.returncode == 2 and "tensor_parallel_size 16 > 8 GPU(s)" in refused.stderr


def test_a_profile_whose_requires_pass_renders(tmp_path: Path) -> None:
    done = render("helm", PROFILES / "qwen-lora-hopper.yaml", "h100.json", tmp_path / "out")
    assert done.returncode == 0, done.stderr
