"""The canary container's keeper (issue 34, `deploykit.render.canary_keeper`), with real child processes: a
child that exits is started again with a growing backoff and the keeper stays; a child that stops writing
its verdict is killed and started again; SIGTERM reaches the child and the keeper exits clean; a last
`unknown` verdict becomes `misconfigured`, `corrupt` stays; it sleeps between events. Short intervals come
from its options; every wait is on a condition with a generous deadline (CI runs on a loaded machine)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deploykit import exit_codes
from deploykit.render.canary_keeper import Keeper, KeeperOptions, _Child, next_backoff, parse

DEADLINE_S = 60.0
# A stand-in canary: appends its pid to `starts`, then does what argv[2] says.
CHILD = """
import json, os, signal, sys, time
starts, verdict, how = sys.argv[1], sys.argv[2], sys.argv[3]
with open(starts, "a") as handle:
    handle.write(f"{os.getpid()}\\n")
def write(status):
    with open(verdict + ".tmp", "w") as handle:
        json.dump({"format": "deploykit-canary-verdict/1", "status": status, "diagnosis": "test"}, handle)
    os.replace(verdict + ".tmp", verdict)
def on_term(signum, frame):
    with open(starts + ".term", "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    write("unknown")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
if how == "exit":
    sys.exit(3)
if how == "crash-unknown":
    write("unknown")
    sys.exit(1)
if how == "crash-corrupt":
    write("corrupt")
    sys.exit(1)
if how == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if how in ("silent", "stubborn"):
    while True:
        time.sleep(3600)
while True:  # "alive": a verdict every 0.2 s
    write("healthy")
    time.sleep(0.2)
"""


def wait_for(what: str, check: Callable[[], object], timeout: float = DEADLINE_S) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout:.0f} s")


class Kept:
    """A keeper process and its stand-in canary's files."""

    def __init__(self, tmp_path: Path, how: str, *options: str) -> None:
        self.starts = tmp_path / "starts"
        self.verdict = tmp_path / "verdict.json"
        self.stderr = tmp_path / "keeper.stderr"
        child = [sys.executable, "-c", CHILD, str(self.starts), str(self.verdict), how]
        argv = [sys.executable, "-m", "deploykit.render.canary_keeper", "--verdict-file", str(self.verdict)]
        with self.stderr.open("wb") as err:
            self.process = subprocess.Popen(
                [*argv, *options, "--", *child], stderr=err, stdout=subprocess.DEVNULL, env=os.environ.copy()
            )

    def pids(self) -> list[int]:
        try:
            return [int(line) for line in self.starts.read_text().split()]
        except FileNotFoundError:
            return []

    def lines(self) -> list[str]:
        return self.stderr.read_text().splitlines()

    def restart_lines(self, count: int) -> list[str]:
        """The first `count` restart lines, once there are that many."""

        def found() -> list[str]:
            return [line for line in self.lines() if "; restart " in line]

        wait_for(f"{count} restart lines", lambda: len(found()) >= count)
        return found()[:count]

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=DEADLINE_S)


@pytest.fixture
def kept(tmp_path: Path) -> Iterator[Callable[..., Kept]]:
    made: list[Kept] = []

    def make(how: str, *options: str) -> Kept:
        made.append(Kept(tmp_path, how, *options))
        return made[-1]

    yield make
    for keeper in made:
        if keeper.process.poll() is None:
            keeper.process.kill()
            keeper.process.wait(timeout=DEADLINE_S)
        for pid in keeper.pids():  # never leave a stand-in behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_backoff_doubles_to_its_cap_and_starts_afresh_after_a_long_run() -> None:
    options = KeeperOptions(("x",), "v", backoff_start_s=1, backoff_cap_s=8, reset_after_s=100)
    waits, last = [], None
    for _ in range(6):
        last = next_backoff(last, 0.5, options)
        waits.append(last)
    assert waits == [1, 2, 4, 8, 8, 8]
    assert next_backoff(8, 100, options) == 1


def test_a_child_that_exits_is_started_again_with_a_growing_backoff(kept: Callable[..., Kept]) -> None:
    keeper = kept("exit", "--backoff-start", "0.1", "--backoff-cap", "0.4")
    lines = keeper.restart_lines(5)
    waits = [float(re.search(r"restart \d+ in ([\d.]+) s$", line).group(1)) for line in lines]  # type: ignore[union-attr]
    assert waits == [0.1, 0.2, 0.4, 0.4, 0.4], lines
    assert all("exited with status 3" in line for line in lines), lines
    assert [f"restart {n} in" in line for n, line in enumerate(lines, 1)] == [True] * 5
    assert keeper.process.poll() is None  # the keeper never exits on the child's account
    assert len(set(keeper.pids())) >= 5
    assert keeper.stop() == exit_codes.OK


def test_a_silent_child_is_killed_and_started_again(kept: Callable[..., Kept]) -> None:
    keeper = kept("silent", "--max-verdict-age", "1", "--check-every", "0.2", "--backoff-start", "0.1")
    (line,) = keeper.restart_lines(1)
    assert "wrote no verdict for" in line and "hung, killed" in line and "SIGKILL" not in line, line
    wait_for("a second child", lambda: len(keeper.pids()) >= 2)
    assert keeper.process.poll() is None
    assert keeper.stop() == exit_codes.OK


@contextlib.contextmanager
def sleeping_child() -> Iterator[subprocess.Popen[bytes]]:
    """A child that would live a minute: the keeper's kill is what ends it (killed here if it did not)."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_child_whose_verdict_is_fresh_is_left_alone(tmp_path: Path) -> None:
    """The hung check reads the verdict's mtime: started long ago, written just now, the child stays."""
    verdict = tmp_path / "verdict.json"
    verdict.write_text("{}")
    with sleeping_child() as process:
        keeper = Keeper(KeeperOptions(("x",), str(verdict), max_verdict_age_s=600), say=print)
        keeper.child = _Child(process, time.monotonic(), time.time() - 3600)
        keeper._check_stale()
        assert keeper.child.killed_why is None and process.poll() is None
        os.utime(verdict, (time.time() - 601, time.time() - 601))
        keeper._check_stale()
        assert "wrote no verdict for 601 s (over 600)" in str(keeper.child.killed_why)
        assert process.wait(timeout=DEADLINE_S) == -signal.SIGKILL


def test_a_verdict_dated_in_the_future_never_turns_the_hung_check_off(tmp_path: Path) -> None:
    """A future mtime (a clock stepped back, or a write that set it) made the child fresh for ever. Past a
    few seconds of skew it is not trusted: the child is judged by its own start, hung after max age."""
    verdict = tmp_path / "verdict.json"
    verdict.write_text("{}")
    with sleeping_child() as process:
        keeper = Keeper(KeeperOptions(("x",), str(verdict), max_verdict_age_s=600), say=print)
        keeper.child = _Child(process, time.monotonic(), time.time() - 601)
        os.utime(verdict, (time.time() + 2, time.time() + 2))  # a clock a little ahead: fresh
        keeper._check_stale()
        assert keeper.child.killed_why is None and process.poll() is None
        os.utime(verdict, (time.time() + 3600, time.time() + 3600))
        keeper._check_stale()
        assert "in the future" in str(keeper.child.killed_why), keeper.child.killed_why
        assert "hung, killed" in str(keeper.child.killed_why)
        assert process.wait(timeout=DEADLINE_S) == -signal.SIGKILL


def test_sigterm_reaches_the_child_and_the_keeper_exits_clean(kept: Callable[..., Kept]) -> None:
    keeper = kept("alive")
    wait_for("a child", keeper.pids)
    wait_for("a verdict", keeper.verdict.exists)
    assert keeper.stop() == exit_codes.OK
    assert (keeper.starts.parent / "starts.term").read_text().split() == [str(keeper.pids()[0])]
    assert "SIGTERM received: stopping the canary" in keeper.stderr.read_text()
    assert json.loads(keeper.verdict.read_text())["status"] == "unknown"  # a stop is not a restart


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(kept: Callable[..., Kept]) -> None:
    keeper = kept("stubborn", "--stop-grace", "0.5")
    wait_for("a child", keeper.pids)
    wait_for("its SIGTERM ignored", lambda: _ignores(keeper.pids()[0], signal.SIGTERM))
    assert keeper.stop() == exit_codes.FAILED
    assert "the canary did not stop within 0.5 s: killed" in keeper.stderr.read_text()


def _ignores(pid: int, sig: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return bool(ignored >> (sig - 1) & 1)


def test_a_last_unknown_verdict_becomes_misconfigured_and_corrupt_stays(
    kept: Callable[..., Kept], tmp_path: Path
) -> None:
    keeper = kept("crash-unknown", "--backoff-start", "30")
    keeper.restart_lines(1)
    verdict = json.loads(keeper.verdict.read_text())
    assert verdict["status"] == "misconfigured" and "exited with status 1" in verdict["diagnosis"], verdict
    assert verdict["keeper_restarts"] == 1
    assert keeper.stop() == exit_codes.OK  # during the backoff: no child to stop
    (tmp_path / "starts").unlink()
    other = kept("crash-corrupt", "--backoff-start", "30")
    other.restart_lines(1)
    assert json.loads(other.verdict.read_text())["status"] == "corrupt"  # about vLLM: the probes act on it
    assert other.stop() == exit_codes.OK


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_the_keeper_sleeps_between_events(kept: Callable[..., Kept]) -> None:
    """No busy loop: the keeper's CPU time over 3 s with a quiet child, checking every 0.5 s."""
    keeper = kept("silent", "--check-every", "0.5")
    wait_for("a child", keeper.pids)
    before, started = _cpu_s(keeper.process.pid), time.monotonic()
    wait_for("three seconds", lambda: time.monotonic() - started > 3.0)
    used = _cpu_s(keeper.process.pid) - before
    assert used < 0.3, used  # a polling loop burns whatever CPU it is given over the whole window
    assert keeper.stop() == exit_codes.OK


def test_the_command_is_required_and_seconds_must_be_positive(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["--verdict-file", "v", "--", "a", "--b"]).command == ["a", "--b"]
    for argv in (["--verdict-file", "v"], ["--verdict-file", "v", "--backoff-cap", "0", "--", "a"]):
        with pytest.raises(SystemExit) as exited:
            parse(argv)
        assert exited.value.code == exit_codes.USAGE
    assert "command is missing" in capsys.readouterr().err


def test_the_keeper_runs_from_the_pod_wheel_with_the_standard_library_alone(tmp_path: Path) -> None:
    """As the chart runs it: `python3 -S` (no site-packages: nothing but the standard library) with only the
    pod's wheel on PYTHONPATH; a crashing child's last `unknown` is replaced from the wheel's own writer."""
    from deploykit.render.plugin_wheel import build_plugin_wheel

    wheel = tmp_path / "deploykit.whl"
    wheel.write_bytes(build_plugin_wheel().data)
    verdict, starts = tmp_path / "verdict.json", tmp_path / "starts"
    child = [sys.executable, "-S", "-c", CHILD, str(starts), str(verdict), "crash-unknown"]
    argv = [sys.executable, "-S", "-m", "deploykit.render.canary_keeper", "--verdict-file", str(verdict)]
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(wheel)}
    with (tmp_path / "stderr").open("wb") as err:
        process = subprocess.Popen([*argv, "--backoff-start", "30", "--", *child], stderr=err, env=env)
    try:
        wait_for("a restart line", lambda: "; restart 1 in 30 s" in (tmp_path / "stderr").read_text())
        assert json.loads(verdict.read_text())["status"] == "misconfigured"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=DEADLINE_S) == exit_codes.OK
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
