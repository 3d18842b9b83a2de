"""`deploykit render` refuses, in one line and a non-zero exit, what could never run where the facts say it
lands (issue 34): a profile whose `requires` fail (a Hopper-only profile on an A100), which `--force` renders
anyway, with a warning; and (issue 44) a parallel layout the node cannot hold (tensor 8 × pipeline 2 on 8
GPUs: vLLM's world size is 16), which no flag renders, and a group spanning nodes, not rendered yet. What is
rendered asks for the layout's GPUs (the world size per node), not the tensor-parallel size."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

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


@pytest.mark.parametrize("kind", ["helm", "systemd"])
def test_tensor_8_pipeline_2_on_8_gpus_is_refused_naming_16(kind: str, tmp_path: Path) -> None:
    """Issue 44: the pod asked for `nvidia.com/gpu: 8` and vLLM (world size 16) never started; now the plan
    refuses it, naming the numbers and the way out, and `--force` does not render a launch that cannot run."""
    changes = {"serve.tensor_parallel_size": 8, "serve.extra_args": ["--pipeline-parallel-size", "2"]}
    profile = profile_variant(tmp_path, "qwen-lora-hopper", changes)
    for extra in ((), ("--force",)):
        refused = render(kind, profile, "h100x8.json", tmp_path / "out", *extra)
        (line,) = refused.stderr.strip().splitlines()
        assert refused.returncode == 2, refused.stderr
        assert line.endswith(
            "1 error(s): needs 16 GPUs per node (tensor 8 × pipeline 2) but the node has 8: set "
            "deploy.nodes: 2 or lower the parallel sizes"
        )
        assert not (tmp_path / "out").exists()


def test_tensor_parallel_16_on_8_gpus_is_refused(tmp_path: Path) -> None:
    profile = profile_variant(tmp_path, "qwen-lora-hopper", {"serve.tensor_parallel_size": 16})
    refused = render("helm", profile, "h100x8.json", tmp_path / "out")
    assert (
        refused.returncode == 2 and "needs 16 GPUs per node (tensor 16) but the node has 8" in refused.stderr
    )


def test_the_chart_asks_for_the_world_size_not_the_tensor_parallel_size(tmp_path: Path) -> None:
    """Tensor 4 × pipeline 2 (pipeline from extra_args, as `-pp`): 8 GPUs requested and limited, not 4."""
    changes = {"serve.tensor_parallel_size": 4, "serve.extra_args": ["-pp", "2"]}
    profile = profile_variant(tmp_path, "qwen-lora-hopper", changes)
    done = render("helm", profile, "h100x8.json", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    values = yaml.safe_load((tmp_path / "out" / "qwen-lora-hopper" / "values.yaml").read_text())
    assert values["resources"]["limits"] == {"nvidia.com/gpu": 8}
    assert values["resources"]["requests"]["nvidia.com/gpu"] == 8


def test_the_unit_opens_the_world_sizes_gpus(tmp_path: Path) -> None:
    """Tensor 2 × 2 of the 4 data-parallel ranks on this host: the unit opens 4 GPUs (2 before)."""
    changes = {
        "serve.tensor_parallel_size": 2,
        "serve.extra_args": ["-dp", "4", "--data-parallel-size-local=2"],
    }
    profile = profile_variant(tmp_path, "qwen-lora-hopper", changes)
    done = render("systemd", profile, "h100x8.json", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    unit = (tmp_path / "out" / "deploykit-qwen-lora-hopper.service").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in unit


def test_a_profile_whose_requires_pass_renders(tmp_path: Path) -> None:
    done = render("helm", PROFILES / "qwen-lora-hopper.yaml", "h100.json", tmp_path / "out")
    assert done.returncode == 0, done.stderr


def test_the_charts_group_argvs_are_checked_against_the_target_option_table(tmp_path: Path) -> None:
    """A one-node chart carries the argv as `deploykit plan` checked it; a group's leader and worker argvs
    (the plan's with vLLM's node flags) are checked against vLLM 0.33.0's table too, and refused."""
    changes = {
        "serve.tensor_parallel_size": 8,
        "serve.pipeline_parallel_size": 2,
        "deploy.nodes": 2,
        "serve.extra_args": ["--no-such-flag"],
    }
    refused = render(
        "helm", profile_variant(tmp_path, "qwen-lora-hopper", changes), "h100x8.json", tmp_path / "o"
    )
    assert refused.returncode == 2, refused.stderr
    assert "node 0's argv is rejected by the parser of vLLM 0.33.0" in refused.stderr
    assert "--no-such-flag" in refused.stderr and not (tmp_path / "o").exists()
