"""`render systemd`'s canary unit: verified and hardened like the smoke companion, and it restarts the
server unit on the canary's corruption verdict (exit 3) and on nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploykit.render.on_corruption import LEDGER_NAME, STAGE_RESTART, STAGE_STOPPED
from deploykit.render.on_corruption import main as on_corruption
from tests.profile_variants import profile_variant
from tests.render.test_systemd import (
    PREFIX,
    SMOKE_EXPOSURE_MAX,
    exposure,
    render,
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
    assert "Restart=on-failure" in text and "RestartPreventExitStatus=3 5" in text
    post = unit_value(text, "ExecStopPost")
    assert post.startswith("+")
    argv = split_command_line(post[1:])
    assert argv[1:] == [
        *("-m", "deploykit.render.on_corruption", "--restart", f"{UNIT}.service"),
        *("--state-dir", f"/var/lib/{UNIT}", "--max-restarts", "3", "--window-s", "3600"),
        *("--profile", "gemma4-turing"),
    ]
    assert "after 3 corruption restarts within 3600 s" in text  # the policy, said in the unit


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


# --- restart storms are bounded (issue 21, point 4) -------------------------------------------------------

CORRUPT = {"EXIT_CODE": "exited", "EXIT_STATUS": "3"}


class Recorder:
    def __init__(self) -> None:
        self.commands: list[list[str]] = []
        self.rows: list[tuple[str, str, dict[str, float]]] = []

    def run(self, command: list[str]) -> int:
        self.commands.append(command)
        return 0

    def record(self, stage: str, diagnosis: str, timings: dict[str, float]) -> None:
        self.rows.append((stage, diagnosis, timings))


def capped(state: Path, recorder: Recorder, at: float, env: dict[str, str] | None = None) -> int:
    argv = ["--restart", "x.service", "--state-dir", str(state), "--max-restarts", "3", "--window-s", "3600"]
    return on_corruption(argv, env or CORRUPT, recorder.run, recorder.record, lambda: at)


def test_corruption_restarts_are_capped_per_window(tmp_path: Path) -> None:
    recorder = Recorder()
    for i in range(3):  # three verdicts within the hour: three restarts, each counted
        assert capped(tmp_path, recorder, 1000.0 + 60 * i) == 0
    assert recorder.commands == [["systemctl", "restart", "--no-block", "x.service"]] * 3
    assert len((tmp_path / LEDGER_NAME).read_text().split()) == 3
    assert [stage for stage, _, _ in recorder.rows] == [STAGE_RESTART] * 3
    assert "corruption restart 3 of at most 3 within 3600 s" in recorder.rows[-1][1]
    # the fourth within the window stops the server and leaves it stopped: one line, one row, no restart
    assert capped(tmp_path, recorder, 1300.0) == 0
    assert recorder.commands[-1] == ["systemctl", "stop", "--no-block", "x.service"]
    stage, diagnosis, timings = recorder.rows[-1]
    assert stage == STAGE_STOPPED and "leaving it stopped" in diagnosis and timings["restarts"] == 3.0
    assert len((tmp_path / LEDGER_NAME).read_text().split()) == 3  # a stop is not a restart
    # an hour after the first restarts the window has forgotten them: a restart again
    assert capped(tmp_path, recorder, 1000.0 + 3600 + 61) == 0
    assert recorder.commands[-1] == ["systemctl", "restart", "--no-block", "x.service"]
    assert len((tmp_path / LEDGER_NAME).read_text().split()) == 2


def test_a_hung_engine_restarts_under_the_same_cap_as_corruption(tmp_path: Path) -> None:
    """Exit 5 (a hung engine) restarts the server and counts in the same ledger: two corruptions and one
    hang fill a cap of three, and the next of either stops the server."""
    recorder = Recorder()
    hung = {"EXIT_CODE": "exited", "EXIT_STATUS": "5"}
    assert capped(tmp_path, recorder, 1000.0, hung) == 0
    assert recorder.commands == [["systemctl", "restart", "--no-block", "x.service"]]
    assert "the engine is hung, restarting x.service (corruption restart 1 of" in recorder.rows[0][1]
    capped(tmp_path, recorder, 1010.0)
    capped(tmp_path, recorder, 1020.0)
    assert capped(tmp_path, recorder, 1030.0, hung) == 0
    assert recorder.commands[-1] == ["systemctl", "stop", "--no-block", "x.service"]
    assert "the engine is hung again after 3 corruption restarts" in recorder.rows[-1][1]


def test_a_non_corruption_end_never_counts_or_stops(tmp_path: Path) -> None:
    recorder = Recorder()
    for status in ("0", "1", "2", "4"):
        assert capped(tmp_path, recorder, 1000.0, {"EXIT_CODE": "exited", "EXIT_STATUS": status}) == 0
    assert capped(tmp_path, recorder, 1000.0, {"EXIT_CODE": "killed", "EXIT_STATUS": "KILL"}) == 0
    assert recorder.commands == [] and recorder.rows == [] and not (tmp_path / LEDGER_NAME).exists()


def test_an_unreadable_ledger_line_is_ignored(tmp_path: Path) -> None:
    (tmp_path / LEDGER_NAME).write_text("garbage\n999.0\n")
    recorder = Recorder()
    assert capped(tmp_path, recorder, 1000.0) == 0
    assert recorder.commands == [["systemctl", "restart", "--no-block", "x.service"]]
    assert (tmp_path / LEDGER_NAME).read_text().split() == ["999.000", "1000.000"]


def test_the_decision_row_is_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deploykit.store import open_store

    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    monkeypatch.setenv("DEPLOYKIT_STORE", url)
    argv = ["--record-row", STAGE_STOPPED, "--diagnosis", "stopped: cap", "--profile", "p", "--restarts", "3"]
    assert on_corruption(argv) == 0
    store = open_store(url)
    try:
        (row,) = store.recent()
    finally:
        store.close()
    assert (row.command, row.stage, row.verdict, row.profile_name) == ("canary", STAGE_STOPPED, "fail", "p")
    assert row.diagnosis == "stopped: cap" and row.timings["restarts"] == 3.0


# --- two profiles side by side (issue 21, point 5) --------------------------------------------------------


def test_two_profiles_get_their_own_canary_port_and_state(tmp_path: Path, turing_facts: Path) -> None:
    listens, states = [], []
    for name, port in (("side-a", 8000), ("side-b", 8001)):
        profile = profile_variant(tmp_path, "gemma4-turing", {"name": name, "serve.port": port})
        files = render(profile, turing_facts, tmp_path / name)
        canary = files[f"deploykit-{name}-canary.service"]
        argv = split_command_line(unit_value(canary, "ExecStart"))
        listens.append(argv[argv.index("--listen") + 1])
        states += [
            unit_value(files[f"deploykit-{name}{s}.service"], "StateDirectory") for s in ("", "-canary")
        ]
    # the default port keeps the old 9400; another server port, another canary port
    assert listens == ["127.0.0.1:9400", "127.0.0.1:9401"]
    assert states == ["deploykit-side-a", "deploykit-side-a", "deploykit-side-b", "deploykit-side-b"]


def test_the_canary_port_stays_a_port_at_the_top_of_the_range(tmp_path: Path, turing_facts: Path) -> None:
    profile = profile_variant(tmp_path, "gemma4-turing", {"serve.port": 65000})
    canary = render(profile, turing_facts, tmp_path / "out")["deploykit-gemma4-turing-canary.service"]
    argv = split_command_line(unit_value(canary, "ExecStart"))
    assert argv[argv.index("--listen") + 1] == "127.0.0.1:63600"
