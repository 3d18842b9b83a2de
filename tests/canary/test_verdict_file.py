"""The verdict file is only ever a regular file deploykit wrote: anything else at the path (a symlink, a
character device, a FIFO, a directory, an unrelated file) is refused and left as it was (issue 30, item 5)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from deploykit import exit_codes
from deploykit.canary.verdict import (
    FORMAT,
    ForeignVerdictPath,
    VerdictFileHeld,
    check_replaceable,
    hold_verdict_file,
    write_verdict_file,
)
from tests.cli_process import PythonProcess, start_python
from tests.smoke.hostile_server import MODEL, Hostile

VERDICT = {"status": "healthy", "diagnosis": "completion: ok", "written_at": 1.0, "pid": 7}
WAIT_S = 60.0


def test_a_missing_path_and_deploykits_own_verdict_are_written(tmp_path: Path) -> None:
    path = tmp_path / "verdict.json"
    write_verdict_file(path, VERDICT)
    write_verdict_file(path, {**VERDICT, "status": "corrupt"})  # its own file: replaced
    assert json.loads(path.read_text()) == {"format": FORMAT, **VERDICT, "status": "corrupt"}


def test_a_verdict_written_before_the_format_field_is_still_deploykits(tmp_path: Path) -> None:
    path = tmp_path / "verdict.json"
    path.write_text(json.dumps(VERDICT) + "\n")  # what deploykit wrote before `format` existed
    write_verdict_file(path, {**VERDICT, "status": "hung"})
    assert json.loads(path.read_text())["status"] == "hung"


def test_the_character_device_itself_is_refused() -> None:
    """As root, `--verdict-file /dev/null` replaced the host's /dev/null; now it is refused (only read)."""
    before = os.stat("/dev/null")
    with pytest.raises(ForeignVerdictPath, match="is a character device"):
        write_verdict_file("/dev/null", VERDICT)
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def _mknod_null(path: Path) -> bool:
    try:
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    except (PermissionError, OSError):
        return False
    return True


@pytest.mark.parametrize("kind", ["symlink to /dev/null", "mknod", "fifo", "directory", "symlink to a file"])
def test_anything_but_a_regular_file_is_refused_and_left_alone(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "verdict.json"
    victim = tmp_path / "victim.json"
    victim.write_text(json.dumps({"format": FORMAT, **VERDICT}))  # even a verdict behind a link
    if kind == "symlink to /dev/null":
        path.symlink_to("/dev/null")
    elif kind == "mknod":
        if not _mknod_null(path):
            pytest.skip("mknod is not allowed here (the /dev/null test above covers a real device)")
    elif kind == "fifo":
        os.mkfifo(path)  # opened without blocking: the canary never stalls on it
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(victim)
    before = os.lstat(path)
    with pytest.raises(ForeignVerdictPath):
        write_verdict_file(path, VERDICT)
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)  # the same thing, untouched
    assert json.loads(victim.read_text()) == {"format": FORMAT, **VERDICT}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["verdict.json", "victim.json"])  # no temp


@pytest.mark.parametrize(
    "content",
    [
        "DATABASE_URL=postgres://...\n",  # an unrelated file
        json.dumps({"status": "healthy"}),  # JSON, but not deploykit's verdict
        json.dumps([1, 2, 3]),
        "x" * (70 * 1024),  # too big to be a verdict
        "",
    ],
)
def test_an_unrelated_file_is_refused_and_unchanged(tmp_path: Path, content: str) -> None:
    path = tmp_path / "settings"
    path.write_text(content)
    with pytest.raises(ForeignVerdictPath, match="holds something other than deploykit's verdict"):
        write_verdict_file(path, VERDICT)
    assert path.read_text() == content


def test_check_replaceable_allows_only_the_two_cases(tmp_path: Path) -> None:
    check_replaceable(str(tmp_path / "missing"))
    own = tmp_path / "own"
    write_verdict_file(own, VERDICT)
    check_replaceable(str(own))


def _verdict_of(path: Path, child: PythonProcess, status: str, other_than: str = "") -> dict[str, Any]:
    """The verdict at `path` once it says `status` (written by a run other than `other_than`)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        assert child.poll() is None, child.communicate()
        with contextlib.suppress(OSError, ValueError):
            verdict: dict[str, Any] = json.loads(path.read_text())
            if verdict["status"] == status and verdict["run_id"] != other_than:
                return verdict
        assert time.monotonic() < deadline, f"no {status} verdict in {WAIT_S:g} s"
        time.sleep(0.05)


def test_a_second_canary_on_one_verdict_file_is_refused_while_the_first_holds_it(tmp_path: Path) -> None:
    """Two canaries on one verdict file overwrote each other's verdicts without a word. The first to take the
    file holds it for its life (a lock beside it): a second is refused in one line naming the first (exit 2,
    its input refused), the first's verdict untouched; once the first is gone, killed even, it is free."""
    verdict = tmp_path / "verdict.json"
    with Hostile("good").serving() as url:
        argv = ["-m", "deploykit", "canary", "--url", url, "--model", MODEL, "--no-store", "--every", "0.2"]
        argv += ["--metrics-every", "0", "--listen", "127.0.0.1:0", "--verdict-file", str(verdict)]
        argv += ["--no-watch-restarts"]
        started: list[PythonProcess] = []
        try:
            first = start_python(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started.append(first)
            held = _verdict_of(verdict, first, "healthy")  # written: the first holds the file
            second = start_python(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started.append(second)
            try:
                _out, err = second.communicate(timeout=WAIT_S)
            except subprocess.TimeoutExpired:
                raise AssertionError("the second canary ran beside the first") from None
            assert second.returncode == exit_codes.USAGE, err
            (line,) = err.splitlines()
            assert line.startswith("deploykit: ") and str(verdict) in line, line
            assert f"another canary (pid {first.pid})" in line, line
            assert _verdict_of(verdict, first, "healthy")["run_id"] == held["run_id"]
            first.kill()  # a crash: the lock goes with the process
            first.communicate()
            third = start_python(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            started.append(third)
            _verdict_of(verdict, third, "healthy", other_than=held["run_id"])
            third.send_signal(signal.SIGTERM)
            third.communicate(timeout=WAIT_S)
            assert third.returncode == exit_codes.OK
        finally:
            for child in started:
                if child.poll() is None:
                    child.kill()
                    child.communicate()


def test_the_lock_is_never_taken_through_a_link(tmp_path: Path) -> None:
    """A link planted where the lock goes is refused, its target neither created nor truncated."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (tmp_path / ".verdict.json.lock").symlink_to(victim)
    with pytest.raises(ForeignVerdictPath, match="is a symbolic link"):
        hold_verdict_file(str(tmp_path / "verdict.json"))
    assert victim.read_text() == "precious\n"


def test_a_held_lock_names_its_holder_when_it_can(tmp_path: Path) -> None:
    path = str(tmp_path / "verdict.json")
    fd = hold_verdict_file(path)
    try:
        with pytest.raises(VerdictFileHeld) as held:
            hold_verdict_file(path)  # another open file: flock refuses it even in this process
        assert held.value.holder == os.getpid()
        os.pwrite(fd, b"\x1b[2J not a pid\n", 0)  # whatever the file says, only a number is taken
        with pytest.raises(VerdictFileHeld) as held:
            hold_verdict_file(path)
        assert held.value.holder is None
    finally:
        os.close(fd)
    os.close(hold_verdict_file(path))  # closed: free again
