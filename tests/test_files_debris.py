"""A render killed mid-write leaves its temporary `.deploykit-writing-*` directory; the next write of a set
into that directory removes it (and leaves a running render's own alone). A real process, SIGKILLed while
it writes."""

from __future__ import annotations

import os
import signal
import textwrap
import time
from pathlib import Path

from deploykit.files import OutFile, write_set
from tests.cli_process import start_python
from tests.vllm_harness import REPO

_KILLED_MID_WRITE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import deploykit.files as files

    out, marker = Path(sys.argv[1]), Path(sys.argv[2])
    write = files._write_new

    def slow_write(name, dir_fd, content, mode):
        write(name, dir_fd, content, mode)
        marker.write_text("written one")
        time.sleep(600)  # until the test's SIGKILL

    files._write_new = slow_write
    files.write_set(out, [files.OutFile("a.service", b"[Unit]\\n"), files.OutFile("b.service", b"x")])
    """
)


def _debris(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(".deploykit-writing-"))


def test_a_render_killed_mid_write_leaves_debris_the_next_render_removes(tmp_path: Path) -> None:
    out, marker = tmp_path / "out", tmp_path / "marker"
    process = start_python(["-c", _KILLED_MID_WRITE, str(out), str(marker)], cwd=REPO)  # forked: its own pid
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    (left,) = _debris(out)
    assert left.startswith(f".deploykit-writing-{process.pid}-")
    assert not (out / "a.service").exists()

    live = out / f".deploykit-writing-{os.getpid()}-{'0' * 12}"  # a render running now: not debris
    live.mkdir()
    old_release = out / f".deploykit-writing-{'1' * 12}"  # an older release's, an hour old
    old_release.mkdir()
    (old_release / "0").write_bytes(b"half")
    os.utime(old_release, (time.time() - 3600, time.time() - 3600))

    written = write_set(out, [OutFile("a.service", b"[Unit]\n")])
    assert [p.name for p in written.written] == ["a.service"]
    assert _debris(out) == [live.name]
