"""Start `vllm serve` as a child in its own process group, wait until it answers, stop it with nothing left.

Used by `deploykit serve` and by the end-to-end test harness, so both exercise the same code.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from deploykit import errors, net
from deploykit.logtail import tail
from deploykit.paths import create_private_file, make_private_dirs

LaunchError = errors.LaunchError  # defined once, in deploykit.errors; raised here


def read_tail(path: Path, max_lines: int = 40) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode(errors="replace")
    except OSError:
        return ""
    return tail(data, max_lines)  # without exit noise, blank lines and progress bars


@dataclass
class ServerProcess:
    """A running `vllm serve` and where its log goes."""

    process: subprocess.Popen[bytes]
    log_path: Path
    base_url: str
    started_at: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def log_tail(self, max_lines: int = 40) -> str:
        return read_tail(self.log_path, max_lines)

    def last_log_line(self) -> str:
        tail = self.log_tail(5).strip().splitlines()
        return tail[-1] if tail else ""

    def wait_healthy(
        self,
        timeout_s: float,
        on_progress: Callable[[float, str], None] | None = None,
        poll_s: float = 0.5,
    ) -> float:
        """Wait for /health to answer 200; returns seconds taken. Raises LaunchError on death or timeout."""
        deadline = self.started_at + timeout_s
        while True:
            code = self.exit_code()
            if code is not None:
                raise LaunchError(
                    f"vLLM exited during start-up with code {code}",
                    server_exit_code=code,
                    log_tail=self.log_tail(),
                )
            if net.health_ok(net.health_url(self.base_url), timeout_s=2):
                return time.monotonic() - self.started_at
            now = time.monotonic()
            if on_progress is not None:
                on_progress(now - self.started_at, self.last_log_line())
            if now >= deadline:
                raise LaunchError(
                    f"vLLM did not answer {self.base_url}/health within {timeout_s:.0f} s",
                    log_tail=self.log_tail(),
                )
            time.sleep(poll_s)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the whole process group, then SIGKILL what is left; waits until every member is gone."""
        pgid = self.process.pid
        _signal_group(pgid, signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(pgid, signal.SIGKILL)
            self.process.wait(timeout=10)
        # vLLM's engine core and workers outlive the API server by a second or two.
        deadline = time.monotonic() + grace_s
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            _signal_group(pgid, signal.SIGKILL)
            while _group_alive(pgid) and time.monotonic() < deadline + 10:
                time.sleep(0.1)
        return self.process.returncode


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _parent_death_guard() -> list[str]:
    """`setpriv --pdeathsig TERM --`: the kernel sends SIGTERM to vLLM if deploykit dies without cleaning up
    (SIGKILL, OOM), and vLLM then stops its own engine and workers. Without util-linux's setpriv, nothing."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


def start_server(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    log_path: Path,
    host: str,
    port: int,
) -> ServerProcess:
    """Start vLLM in a new session (its own process group) with stdout and stderr in `log_path`.

    `host` is the host vLLM binds (`--host`): a wildcard is reached at its family's loopback."""
    argv = [*_parent_death_guard(), *argv]
    try:
        make_private_dirs(log_path.parent)  # logs may hold prompts and paths: the owner's alone
        create_private_file(log_path)
        log_file = log_path.open("ab")
    except OSError as exc:
        raise LaunchError(f"cannot write vLLM's log {log_path}: {exc.strerror}; pass --log-dir DIR") from None
    try:
        process = subprocess.Popen(
            list(argv),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except OSError as exc:
        log_file.close()
        raise LaunchError(f"could not start {argv[0]!r}: {exc.strerror}") from exc
    log_file.close()
    return ServerProcess(process=process, log_path=log_path, base_url=net.base_url(host, port))
