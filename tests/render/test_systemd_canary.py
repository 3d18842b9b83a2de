"""`render systemd`'s canary unit: verified and hardened like the smoke companion, and it restarts the
server unit on the canary's corruption verdict (exit 3) and on nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploykit.render.on_corruption import main as on_corruption
from tests.render.test_systemd import (
    PREFIX,
    SMOKE_EXPOSURE_MAX,
    exposure,
    split_command_line,
    turing_render,
    unit_value,
    verify,
)

__all__ = ["turing_render"]  # the fixture, shared with test_systemd.py

# The canary unit carries the smoke companion's hardening line for line: the same threshold.
CANARY_EXPOSURE_MAX = SMOKE_EXPOSURE_MAX
UNIT = "deploykit-gemma4-turing"


def canary_text(render: tuple[Path, dict[str, Any]]) -> str:
    return (render[0] / f"{UNIT}-canary.service").read_text()


def test_all_three_units_verify_clean(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, _ = turing_render
    units = [out / f"{UNIT}.service", out / f"{UNIT}-smoke.service", out / f"{UNIT}-canary.service"]
    assert verify(*units) == ""


def test_canary_exposure_is_below_the_threshold(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, _ = turing_render
    assert exposure(out / f"{UNIT}-canary.service") <= CANARY_EXPOSURE_MAX


def test_canary_hardening_matches_the_smoke_companion(turing_render: tuple[Path, dict[str, Any]]) -> None:
    out, _ = turing_render
    smoke = (out / f"{UNIT}-smoke.service").read_text()
    hardening = [line for line in smoke[smoke.index("DevicePolicy=closed") :].splitlines() if "=" in line]
    canary = canary_text(turing_render).splitlines()
    assert len(hardening) > 25 and [line for line in hardening if line not in canary] == []


def test_canary_runs_deploykit_canary_with_exit_on_corruption(
    turing_render: tuple[Path, dict[str, Any]],
) -> None:
    text = canary_text(turing_render)
    argv = split_command_line(unit_value(text, "ExecStart"))
    assert argv[:2] == [str(PREFIX / "bin" / "deploykit"), "canary"]
    assert "--exit-on-corruption" in argv and argv[argv.index("--listen") + 1] == "127.0.0.1:9400"
    assert argv[argv.index("--profile") + 1] == "/etc/deploykit/gemma4-turing.yaml"
    assert argv[argv.index("--api-key-env") + 1] == "VLLM_API_KEY"  # the server's key, same env file
    assert (
        "BindsTo=deploykit-gemma4-turing.service" in text and "PartOf=deploykit-gemma4-turing.service" in text
    )
    assert "WantedBy=deploykit-gemma4-turing.service" in text


def test_only_exit_3_restarts_the_server(turing_render: tuple[Path, dict[str, Any]]) -> None:
    text = canary_text(turing_render)
    # exit 3 does not restart the canary itself; any other failure restarts only the canary
    assert "Restart=on-failure" in text and "RestartPreventExitStatus=3" in text
    post = unit_value(text, "ExecStopPost")
    assert post.startswith("+")
    argv = split_command_line(post[1:])
    assert argv[1:] == ["-m", "deploykit.render.on_corruption", "--restart", f"{UNIT}.service"]


@pytest.mark.parametrize(
    ("code", "status", "restarts"),
    [
        ("exited", "3", True),  # the corruption verdict
        ("exited", "0", False),  # stopped cleanly (server stopped: BindsTo)
        ("exited", "1", False),  # a crash
        ("exited", "2", False),  # a usage error
        ("killed", "TERM", False),  # stopped by a signal
        ("dumped", "SEGV", False),
    ],
)
def test_on_corruption_restarts_only_on_the_verdict(code: str, status: str, restarts: bool) -> None:
    ran: list[list[str]] = []

    def run(command: list[str]) -> int:
        ran.append(command)
        return 0

    env = {"EXIT_CODE": code, "EXIT_STATUS": status}
    assert on_corruption(["--restart", "x.service"], env, run) == 0
    assert ran == ([["systemctl", "restart", "--no-block", "x.service"]] if restarts else [])


def test_on_corruption_without_systemd_variables_does_nothing() -> None:
    ran: list[list[str]] = []

    def run(command: list[str]) -> int:
        ran.append(command)
        return 0

    assert on_corruption(["--restart", "x.service"], {}, run) == 0
    assert ran == []
