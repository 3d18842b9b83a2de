"""`deploykit render systemd` of a group spanning nodes (issue 44): tensor 8 × pipeline 2 over 2 nodes of
8 H100s. The leader's set is the one-node set with node rank 0's argv; the worker's unit runs node rank 1's
argv (`--headless`) with the server unit's user, environment, GPUs, release check and sandbox; systemd
itself checks both units; the leader's address is required, and refused when it is no host a worker can
dial."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from deploykit.plan.group import GROUP_MASTER_PORT
from tests.cli_process import run_deploykit
from tests.profile_variants import profile_variant
from tests.render.conftest import planned
from tests.render.test_systemd import (
    SERVER_EXPOSURE_MAX,
    SERVER_HARDENING,
    exposure,
    split_command_line,
    unit_value,
    verify,
)
from tests.unit_prefix import unit_prefix
from tests.vllm_harness import REPO

H100X8 = REPO / "tests" / "fixtures" / "facts" / "h100x8.json"
GROUP = {
    "serve.tensor_parallel_size": 8,
    "serve.pipeline_parallel_size": 2,
    "deploy.nodes": 2,
    "deploy.leader_address": "10.0.0.1",
}
UNIT = "deploykit-qwen-lora-hopper"
LEADER, WORKER = f"{UNIT}.service", f"{UNIT}-worker-1.service"


def render(profile: Path, out: Path, *extra: str) -> Any:
    args = ["render", "systemd", "--profile", str(profile), "--facts", str(H100X8), "--out", str(out)]
    return run_deploykit([*args, "--prefix", str(unit_prefix()), *extra], timeout=180, cwd=REPO)


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any], str]:
    """The rendered set, `deploykit plan`'s json plan of the same profile, and render's stderr."""
    directory = tmp_path_factory.mktemp("group")
    profile = profile_variant(directory, "qwen-lora-hopper", GROUP)
    out = directory / "out"
    done = render(profile, out)
    assert done.returncode == 0, done.stderr
    return out, planned(profile, H100X8), done.stderr


def node_flags(rank: int) -> list[str]:
    return [
        *("--nnodes", "2", "--node-rank", str(rank), "--master-addr", "10.0.0.1"),
        *("--master-port", str(GROUP_MASTER_PORT)),
    ]


def sandbox(unit: str) -> str:
    """The environment, state, devices and hardening: from EnvironmentFile= to UMask=."""
    return unit[unit.index("EnvironmentFile=") : unit.index("UMask=0077")]


def test_the_leader_runs_node_0_and_the_worker_node_1_headless(
    group: tuple[Path, dict[str, Any], str],
) -> None:
    out, plan, _ = group
    leader = split_command_line(unit_value((out / LEADER).read_text(), "ExecStart"))
    worker = split_command_line(unit_value((out / WORKER).read_text(), "ExecStart"))
    vllm = str(unit_prefix() / "bin" / "vllm")
    assert plan["layout"]["nodes"] == 2 and "--nnodes" not in plan["argv"]
    assert leader == [vllm, *plan["argv"][1:], *node_flags(0)]
    assert worker == [vllm, *plan["argv"][1:], *node_flags(1), "--headless"]
    assert plan["argv"][plan["argv"].index("--tensor-parallel-size") + 1] == "8"


def test_both_nodes_open_gpus_0_to_7_with_one_environment_and_sandbox(
    group: tuple[Path, dict[str, Any], str],
) -> None:
    out, plan, _ = group
    leader, worker = (out / LEADER).read_text(), (out / WORKER).read_text()
    for unit in (leader, worker):
        assert "Environment=CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in unit
        nodes = re.findall(r"^DeviceAllow=/dev/nvidia(\d+) rw$", unit, re.M)
        assert nodes == [str(i) for i in range(8)]
        assert (
            f"Environment=DEPLOYKIT_FIXES={plan['env']['DEPLOYKIT_FIXES']}" in unit
        )  # the fixes reach rank 8-15
        # always: vLLM exits with status 0 when the group loses a rank (docs/deploy.md, measured in the e2e)
        for line in ["Type=exec", "Restart=always", "User=vllm", "Group=vllm", *SERVER_HARDENING]:
            assert re.search(rf"^{re.escape(line)}$", unit, re.M), line
    assert sandbox(worker) == sandbox(leader)  # one included text: the same sandbox, line for line
    check = split_command_line(unit_value(worker, "ExecStartPre"))
    assert check == split_command_line(unit_value(leader, "ExecStartPre"))
    assert check[-3:] == ["deploykit.render.vllm_release", "--planned", plan["vllm_version"]]


def test_the_smoke_and_canary_run_on_the_leader_only(group: tuple[Path, dict[str, Any], str]) -> None:
    out, _, stderr = group
    assert sorted(p.name for p in out.glob("*.service")) == sorted(
        [LEADER, WORKER, f"{UNIT}-smoke.service", f"{UNIT}-canary.service", f"{UNIT}-gate.service"]
    )
    leader, worker = (out / LEADER).read_text(), (out / WORKER).read_text()
    assert f"{UNIT}-smoke.service" in unit_value(leader, "Wants")
    assert "ExecStartPost=" in leader and "ExecStartPost=" not in worker  # no API: no health to wait for
    assert "-smoke" not in unit_value(worker, "Wants") and "-smoke" not in worker.split("[Unit]")[1]
    for companion in ("smoke", "canary"):
        assert f"BindsTo={LEADER}" in (out / f"{UNIT}-{companion}.service").read_text()
    assert "deploykit-qwen-lora-hopper-worker-1.service" in leader  # the leader names its workers
    assert "loopback" not in stderr


def test_systemd_verifies_every_unit_of_the_group(group: tuple[Path, dict[str, Any], str]) -> None:
    out, _, _ = group
    units = [out / LEADER, out / WORKER, out / f"{UNIT}-smoke.service", out / f"{UNIT}-canary.service"]
    assert verify(*units) == ""
    assert exposure(out / WORKER) <= SERVER_EXPOSURE_MAX


def test_four_nodes_give_three_workers_one_rank_each(tmp_path: Path) -> None:
    changes = {**GROUP, "serve.pipeline_parallel_size": 4, "deploy.nodes": 4}
    out = tmp_path / "out"
    done = render(profile_variant(tmp_path, "qwen-lora-hopper", changes), out)
    assert done.returncode == 0, done.stderr
    for rank in (1, 2, 3):
        argv = split_command_line(
            unit_value((out / f"{UNIT}-worker-{rank}.service").read_text(), "ExecStart")
        )
        assert argv[argv.index("--node-rank") + 1] == str(rank) and argv[-1] == "--headless"
        assert argv[argv.index("--nnodes") + 1] == "4"
    assert not (out / f"{UNIT}-worker-0.service").exists() and not (out / f"{UNIT}-worker-4.service").exists()
    again = render(profile_variant(tmp_path, "qwen-lora-hopper", changes), out)
    assert again.returncode == 0 and "opens GPU" not in again.stderr, again.stderr  # its own workers


def test_an_ipv6_leader_is_written_bare_and_bracketed_in_the_rendezvous(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = render(
        profile_variant(tmp_path, "qwen-lora-hopper", {**GROUP, "deploy.leader_address": "[fd00::0001]"}), out
    )
    assert done.returncode == 0, done.stderr
    worker = (out / WORKER).read_text()
    argv = split_command_line(unit_value(worker, "ExecStart"))
    assert argv[argv.index("--master-addr") + 1] == "fd00::1"
    assert "[fd00::1]:29501" in (out / LEADER).read_text()
    assert verify(out / LEADER, out / WORKER) == ""


def test_a_missing_leader_address_is_refused_in_one_line(tmp_path: Path) -> None:
    changes = {k: v for k, v in GROUP.items() if k != "deploy.leader_address"}
    done = render(profile_variant(tmp_path, "qwen-lora-hopper", changes), tmp_path / "out")
    (line,) = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert "deploy.nodes is 2, so deploy.leader_address is required" in line
    assert not (tmp_path / "out").exists()


# A line break never gets this far: the profile loader refuses control characters in every value (and the
# renderer's check below refuses one a profile built in code holds).
HOSTILE = [
    "10.0.0.1 --headless",
    "$(id)",
    "%n",
    "-leader",
    "leader;reboot",
    "0.0.0.0",
    "::",
    "10.0.0.256",
]


@pytest.mark.parametrize("address", HOSTILE)
def test_a_hostile_leader_address_is_refused_at_load(address: str, tmp_path: Path) -> None:
    changes = {**GROUP, "deploy.leader_address": address}
    done = render(profile_variant(tmp_path, "qwen-lora-hopper", changes), tmp_path / "out")
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    why = "is a wildcard" if address in ("0.0.0.0", "::") else "is neither a host name"
    assert "deploy.leader_address" in line and why in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address", ["leader\nExecStartPre=/bin/sh", "a b", "$(id)", "%n", "-x", "::"])
def test_render_refuses_a_hostile_address_the_schema_never_saw(address: str, tmp_path: Path) -> None:
    """The second wall: a profile built in code (the schema's validator skipped) is checked again."""
    from deploykit.probe.load import load_facts
    from deploykit.profile.load import load_profile
    from deploykit.profile.schema import LoadedProfile
    from deploykit.render.common import RenderError, plan_for_render
    from deploykit.render.systemd import SystemdOptions, render_systemd

    loaded = load_profile(str(profile_variant(tmp_path, "qwen-lora-hopper", GROUP)))
    plan = plan_for_render(loaded, load_facts(str(H100X8)))
    deploy = loaded.profile.deploy.model_copy(update={"leader_address": address})
    loaded = LoadedProfile(loaded.profile.model_copy(update={"deploy": deploy}), loaded.path)
    with pytest.raises(RenderError, match=r"deploy\.leader_address: ") as refused:
        render_systemd(plan, loaded, SystemdOptions(prefix=Path("/opt/deploykit")))
    assert "\n" not in str(refused.value)


def test_each_node_argv_is_checked_against_the_target_option_table(tmp_path: Path) -> None:
    """One render of a one-node profile writes an unknown flag as it stands (only `deploykit plan` checks
    the argv); for a group each node's argv is checked against vLLM 0.33.0's table, and refused."""
    changes = {**GROUP, "serve.extra_args": ["--no-such-flag"]}
    done = render(profile_variant(tmp_path, "qwen-lora-hopper", changes), tmp_path / "out")
    assert done.returncode == 2, done.stderr
    assert "node 0's argv is rejected by the parser of vLLM 0.33.0" in done.stderr
    assert "--no-such-flag" in done.stderr
