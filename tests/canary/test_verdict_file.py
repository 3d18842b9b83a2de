"""The verdict file is only ever a regular file deploykit wrote: anything else at the path (a symlink, a
character device, a FIFO, a directory, an unrelated file) is refused and left as it was (issue 30, item 5)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from deploykit.canary.verdict import FORMAT, ForeignVerdictPath, check_replaceable, write_verdict_file

VERDICT = {"status": "healthy", "diagnosis": "completion: ok", "written_at": 1.0, "pid": 7}


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
