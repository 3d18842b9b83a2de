"""launch: the child runs in its own process group, and dies with deploykit even when deploykit is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from deploykit.net import free_port, port_in_use
from deploykit.serve.launch import LaunchError, start_server


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat").read_text().split()
    return stat[2] != "Z"


def test_child_is_its_own_group_and_stop_leaves_nothing(tmp_path: Path) -> None:
    server = start_server(
        [sys.executable, "-c", "import time; time.sleep(300)"],
        os.environ,
        log_path=tmp_path / "log",
        host="127.0.0.1",
        port=free_port(),
    )
    assert os.getpgid(server.pid) == server.pid
    server.stop(grace_s=5)
    assert not _alive(server.pid)


def test_child_dies_when_deploykit_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives deploykit no chance to clean up; the kernel's parent-death signal stops the child."""
    if not Path("/usr/bin/setpriv").exists():
        pytest.skip("util-linux setpriv is not installed")
    pid_file = tmp_path / "child.pid"
    parent = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from deploykit.serve.launch import start_server
        server = start_server([sys.executable, "-c", "import time; time.sleep(300)"], os.environ,
                              log_path=Path({str(tmp_path / "log")!r}), host="127.0.0.1", port=1)
        Path({str(pid_file)!r}).write_text(str(server.pid))
        time.sleep(300)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert _alive(child)
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_health_wait_reports_an_early_exit_with_its_code_and_log(tmp_path: Path) -> None:
    port = free_port()
    server = start_server(
        [sys.executable, "-c", "import sys; print('boom: no such model'); sys.exit(7)"],
        os.environ,
        log_path=tmp_path / "log",
        host="127.0.0.1",
        port=port,
    )
    with pytest.raises(LaunchError) as caught:
        server.wait_healthy(timeout_s=30, poll_s=0.05)
    assert caught.value.server_exit_code == 7
    assert "boom: no such model" in caught.value.log_tail
    assert not port_in_use(port)


def test_the_log_tail_keeps_the_error_and_drops_exit_noise(tmp_path: Path) -> None:
    from deploykit.serve.launch import read_tail

    log = tmp_path / "vllm.log"
    noise = [
        "nanobind: leaked 4 instances!",
        ' - leaked instance 0x7f of type "triton._C.libtriton.ir.attribute"',
    ]
    noise += ["nanobind: leaked 64 types!", ' - leaked type "ATOMIC_OP"', " - ... skipped remainder", ""]
    bar = "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.2it/s]"
    log.write_text(
        "\n".join(
            [
                "INFO starting",
                f"{bar}\r{bar}",
                "Traceback (most recent call last):",
                '  File "x.py", line 1',
                "ValueError: the model does not fit",
                "",
                *noise,
            ]
        )
    )
    tail = read_tail(log, 3).splitlines()
    assert tail == [
        "Traceback (most recent call last):",
        '  File "x.py", line 1',
        "ValueError: the model does not fit",
    ]
