"""`render systemd`'s canary unit: verified and hardened like the smoke companion, and it restarts the
server unit on the canary's corruption verdict (exit 3) and on nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deploykit.render.on_corruption import LEDGER_DIR, STAGE_RESTART, STAGE_STOPPED
from deploykit.render.on_corruption import main as on_corruption
from tests.profile_variants import profile_variant
from tests.render.test_systemd import (
    SMOKE_EXPOSURE_MAX,
    exposure,
    render,
    split_command_line,
    turing_render,
    unit_value,
    verify,
)
from tests.unit_prefix import unit_prefix

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
    assert argv[:2] == [str(unit_prefix() / "bin" / "deploykit"), "canary"]
    assert "--exit-on-corruption" in argv and argv[argv.index("--listen") + 1] == "127.0.0.1:9400"
    assert "--keep-running" in argv  # a refused key or name is `misconfigured`, never an exit (issue 34)
    assert argv[argv.index("--profile") + 1] == "/etc/deploykit/gemma4-turing.yaml"
    assert argv[argv.index("--api-key-env") + 1] == "VLLM_API_KEY"  # the server's key, same env file
    assert (
        "BindsTo=deploykit-gemma4-turing.service" in text and "PartOf=deploykit-gemma4-turing.service" in text
    )
    assert "WantedBy=deploykit-gemma4-turing.service" in text


def test_the_unit_passes_the_declared_settings(turing_render: tuple[Path, dict[str, Any]]) -> None:
    """The canary's settings in the unit are `CanarySettings`' defaults under their declared flags."""
    from deploykit.canary.settings import CANARY_FLAGS, DEFAULTS, shown
    from deploykit.render.systemd import UNIT_SETTINGS

    argv = split_command_line(unit_value(canary_text(turing_render), "ExecStart"))
    passed = {name: argv[argv.index(CANARY_FLAGS[name]) + 1] for name in UNIT_SETTINGS}
    assert passed == {"every_s": shown(DEFAULTS.every_s), "listen": "127.0.0.1:9400"}
    assert f"cases every {shown(DEFAULTS.every_s)} s, /healthz, /livez and /metrics on 127.0.0.1:9400" in (
        canary_text(turing_render)
    )


def test_only_exit_3_restarts_the_server(turing_render: tuple[Path, dict[str, Any]]) -> None:
    text = canary_text(turing_render)
    # exit 3 does not restart the canary itself; any other failure restarts only the canary
    assert "Restart=on-failure" in text and "RestartPreventExitStatus=3 5" in text
    post = unit_value(text, "ExecStopPost")
    assert post.startswith("+")
    argv = split_command_line(post[1:])
    assert argv[1:] == [
        # -I: root runs it in the service user's state directory, which must never reach sys.path; -S: the
        # prefix's site-packages only once the root-owned helper outside it has found the prefix root's alone
        *("-I", "-S", "/usr/local/libexec/deploykit/root-helper.py", "--restart", f"{UNIT}.service"),
        *("--exit-status", "3", "--exit-status", "5"),  # corruption, a hung engine (issue 31)
        *("--ledger-dir", LEDGER_DIR, "--state-dir", f"/var/lib/{UNIT}"),
        *("--max-restarts", "3", "--window-s", "3600"),
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


LEDGER = "x.service"  # the ledger file: the server unit's name, in the ledger directory


def capped(tmp: Path, recorder: Recorder, at: float, env: dict[str, str] | None = None) -> int:
    argv = ["--restart", "x.service", "--ledger-dir", str(tmp / "ledger"), "--state-dir", str(tmp)]
    argv += ["--max-restarts", "3", "--window-s", "3600"]
    return on_corruption(argv, env or CORRUPT, recorder.run, recorder.record, lambda: at)


def test_corruption_restarts_are_capped_per_window(tmp_path: Path) -> None:
    recorder = Recorder()
    for i in range(3):  # three verdicts within the hour: three restarts, each counted
        assert capped(tmp_path, recorder, 1000.0 + 60 * i) == 0
    assert recorder.commands == [["systemctl", "restart", "--no-block", "x.service"]] * 3
    assert len((tmp_path / "ledger" / LEDGER).read_text().split()) == 3
    assert [stage for stage, _, _ in recorder.rows] == [STAGE_RESTART] * 3
    assert "corruption restart 3 of at most 3 within 3600 s" in recorder.rows[-1][1]
    # the fourth within the window stops the server and leaves it stopped: one line, one row, no restart
    assert capped(tmp_path, recorder, 1300.0) == 0
    assert recorder.commands[-1] == ["systemctl", "stop", "--no-block", "x.service"]
    stage, diagnosis, timings = recorder.rows[-1]
    assert stage == STAGE_STOPPED and "leaving it stopped" in diagnosis and timings["restarts"] == 3.0
    assert len((tmp_path / "ledger" / LEDGER).read_text().split()) == 3  # a stop is not a restart
    # an hour after the first restarts the window has forgotten them: a restart again
    assert capped(tmp_path, recorder, 1000.0 + 3600 + 61) == 0
    assert recorder.commands[-1] == ["systemctl", "restart", "--no-block", "x.service"]
    assert len((tmp_path / "ledger" / LEDGER).read_text().split()) == 2


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
    assert recorder.commands == [] and recorder.rows == [] and not (tmp_path / "ledger" / LEDGER).exists()


def test_an_unreadable_ledger_line_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir(mode=0o700)
    (tmp_path / "ledger" / LEDGER).write_text("garbage\n999.0\n")
    recorder = Recorder()
    assert capped(tmp_path, recorder, 1000.0) == 0
    assert recorder.commands == [["systemctl", "restart", "--no-block", "x.service"]]
    assert (tmp_path / "ledger" / LEDGER).read_text().split() == ["999.000", "1000.000"]


def test_the_decision_row_is_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from deploykit.results.sql.store import open_store

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


# --- the root helper trusts nothing the service user can write (issue 30, point 2) ------------------------


def test_a_second_exit_status_restarts_too_when_listed() -> None:
    ran: list[list[str]] = []

    def run(command: list[str]) -> int:
        ran.append(command)
        return 0

    env = {"EXIT_CODE": "exited", "EXIT_STATUS": "4"}
    assert on_corruption(["--restart", "x.service", "--exit-status", "3"], env, run) == 0
    assert ran == []
    both = ["--restart", "x.service", "--exit-status", "3", "--exit-status", "4"]
    assert on_corruption(both, env, run) == 0
    assert ran == [["systemctl", "restart", "--no-block", "x.service"]]


def test_a_symlinked_ledger_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / "ledger").mkdir(mode=0o700)
    (tmp_path / "ledger" / LEDGER).symlink_to(victim)
    recorder = Recorder()
    assert capped(tmp_path, recorder, 1000.0) == 0
    assert victim.read_text() == "precious\n"  # neither read as a ledger nor written through
    assert (tmp_path / "ledger" / LEDGER).is_symlink()
    # fail closed: a ledger it cannot trust cannot cap restarts, so the server is stopped, one line and row
    assert recorder.commands == [["systemctl", "stop", "--no-block", "x.service"]]
    ((stage, diagnosis, _),) = recorder.rows
    assert stage == STAGE_STOPPED and "cannot be trusted" in diagnosis


def test_a_symlinked_ledger_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp_path / "ledger").symlink_to(elsewhere)
    recorder = Recorder()
    assert capped(tmp_path, recorder, 1000.0) == 0
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    assert recorder.commands == [["systemctl", "stop", "--no-block", "x.service"]]


def test_a_ledger_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ledger").mkdir()
    (tmp_path / "ledger").chmod(0o777)
    recorder = Recorder()
    assert capped(tmp_path, recorder, 1000.0) == 0
    assert list((tmp_path / "ledger").iterdir()) == []
    assert recorder.commands == [["systemctl", "stop", "--no-block", "x.service"]]


def test_the_ledger_directory_is_made_private(tmp_path: Path) -> None:
    recorder = Recorder()
    assert capped(tmp_path, recorder, 1000.0) == 0
    assert (tmp_path / "ledger").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "ledger" / LEDGER).stat().st_mode & 0o777 == 0o600


PLANTED = """
import os, sys
open(os.environ["PLANTED_MARK"], "w").write(str(os.geteuid()))
sys.exit(0)
"""


@pytest.mark.parametrize("isolated", [True, False])
def test_a_module_planted_in_the_working_directory_is_never_imported(tmp_path: Path, isolated: bool) -> None:
    """The unit's command line, run from a directory holding a planted deploykit/render/on_corruption.py:
    with `-I` (as rendered) the real helper runs; without it (the old line) the planted one would."""
    import os
    import subprocess
    import sys

    state = tmp_path / "state"
    planted = state / "deploykit" / "render"
    planted.mkdir(parents=True)
    for folder in (state / "deploykit", planted):
        (folder / "__init__.py").write_text("")
    (planted / "on_corruption.py").write_text(PLANTED)
    mark = tmp_path / "planted-ran"
    argv = [sys.executable, *(["-I"] if isolated else []), "-m", "deploykit.render.on_corruption"]
    argv += ["--restart", "x.service"]  # no EXIT_* variables: the real helper leaves it alone
    env = {"PATH": os.environ["PATH"], "PLANTED_MARK": str(mark)}
    if not isolated:
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    done = subprocess.run(argv, cwd=state, env=env, capture_output=True, text=True, timeout=60)
    if isolated:
        assert not mark.exists(), "the planted module ran"
        assert done.returncode == 0 and "not a corruption verdict" in done.stdout, done.stdout + done.stderr
    else:
        assert mark.exists()  # the attack the old command line allowed


def test_root_stores_no_row_in_a_state_directory_that_is_not_the_service_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Root never writes the row itself: only a child running as the state directory's (non-root) owner
    does; a root-owned directory or a link in its place gets a journal line and no row."""
    import os

    from deploykit.render.on_corruption import record_row_as_owner

    if os.geteuid() != 0:
        pytest.skip("runs as root only: the helper's privileged path")
    state = tmp_path / "state"
    state.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere)
    for directory in (state, tmp_path / "link"):
        env = {"XDG_DATA_HOME": str(directory), "PATH": os.environ["PATH"]}
        record_row_as_owner(directory, "p", env)(STAGE_RESTART, "restarting", {"restarts": 1.0})
        assert "is not a directory of the service user's own" in capsys.readouterr().out
    assert list(state.iterdir()) == [] and list(elsewhere.iterdir()) == []
