"""systemd units per profile on one host (issue 34): the GPUs a server unit opens are chosen with
`render systemd --gpus` (default 0..N-1), checked against the plan and the facts, and two servers rendered
into one directory on the same GPU are named in a warning; a prefix the unit's own sandbox hides
(/tmp with PrivateTmp, /root or /home with ProtectHome) is refused in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from deploykit.render.common import RenderError
from deploykit.render.unit_gpus import check_prefix_visible, parse_gpus, unit_gpus
from tests.cli_process import run_deploykit
from tests.profile_variants import PROFILES, profile_variant
from tests.vllm_harness import REPO

TWO_V100 = REPO / "tests" / "fixtures" / "facts" / "v100pcie-x2-nop2p.json"


def render(profile: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = ["render", "systemd", "--profile", str(profile)]
    args += ["--facts", str(TWO_V100), "--out", str(out), "--prefix", "/opt/deploykit", *extra]
    return run_deploykit(args, timeout=180, cwd=REPO)


def server_unit(out: Path, name: str) -> str:
    return (out / f"deploykit-{name}.service").read_text()


def test_two_single_gpu_profiles_on_one_host(tmp_path: Path) -> None:
    out = tmp_path / "units"
    first = render(PROFILES / "gemma4-turing.yaml", out)
    assert first.returncode == 0, first.stderr
    text = server_unit(out, "gemma4-turing")
    assert "Environment=CUDA_VISIBLE_DEVICES=0" in text and "DeviceAllow=/dev/nvidia0 rw" in text
    second = profile_variant(tmp_path, "gemma4-turing", {"name": "gemma4-second", "serve.port": 8100})
    same = render(second, out)
    assert same.returncode == 0, same.stderr
    assert "deploykit-gemma4-turing.service in" in same.stderr and "opens GPU 0 too" in same.stderr
    apart = render(second, out, "--gpus", "1")
    assert apart.returncode == 0 and "opens GPU" not in apart.stderr, apart.stderr
    text = server_unit(out, "gemma4-second")
    assert "Environment=CUDA_VISIBLE_DEVICES=1" in text and "DeviceAllow=/dev/nvidia1 rw" in text
    assert "DeviceAllow=/dev/nvidia0 rw" not in text


@pytest.mark.parametrize(
    ("gpus", "words"),
    [("2", "the facts show GPUs 0..1 only"), ("0,1", "names 2 GPU(s); the plan needs 1"), ("a", "indices")],
)
def test_a_gpu_choice_that_cannot_be_is_refused(gpus: str, words: str, tmp_path: Path) -> None:
    refused = render(PROFILES / "gemma4-turing.yaml", tmp_path / "out", "--gpus", gpus)
    assert refused.returncode == 2 and words in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_gpu_choice_rules() -> None:
    assert unit_gpus(None, 2, 8) == [0, 1]
    assert unit_gpus([3], 1, 0) == [3]  # no GPU facts: the index cannot be checked
    assert parse_gpus(" 2, 3") == [2, 3]
    with pytest.raises(RenderError, match="named twice"):
        parse_gpus("1,1")


@pytest.mark.parametrize(
    "prefix", ["/tmp/venv", "/var/tmp/v", "/root/.venv", "/home/ml/venv", "/run/user/0/v"]
)
def test_a_prefix_the_sandbox_hides_is_refused(prefix: str) -> None:
    with pytest.raises(
        RenderError, match=r"which the unit's own sandbox hides \((ProtectHome|PrivateTmp)=yes\)"
    ):
        check_prefix_visible(Path(prefix))


@pytest.mark.parametrize("prefix", ["/opt/deploykit", "/usr", "/srv/home/venv", "/tmpfoo"])
def test_a_visible_prefix_passes(prefix: str) -> None:
    check_prefix_visible(Path(prefix))


def test_render_refuses_a_prefix_under_tmp_in_one_line(tmp_path: Path) -> None:
    args = ["render", "systemd", "-p", "gemma4-turing"]
    args += ["--facts", str(TWO_V100), "--out", str(tmp_path / "o"), "--prefix", "/tmp/not-here/venv"]
    refused = run_deploykit(args, timeout=180, cwd=REPO)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert (
        "--prefix /tmp/not-here/venv: under /tmp, which the unit's own sandbox hides (PrivateTmp=yes)" in line
    )
