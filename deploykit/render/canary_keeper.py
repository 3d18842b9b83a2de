"""The canary container's first process: runs `deploykit canary` as its child and never exits on the
child's account, so a canary that crashes or hangs never restarts its container, which would take a healthy
vLLM out of the Service (CrashLoopBackOff; a pod with a container not running is not Ready). Issue 34.

    python3 -m deploykit.render.canary_keeper --verdict-file F --max-verdict-age 600 -- python3 -m ...

A child that ends is started again after a backoff (doubling to `--backoff-cap`, afresh after a run of
`--reset-after` s); one silent (no verdict written, nor started) for `--max-verdict-age` is hung: SIGKILLed
(a hung process's SIGTERM handler never runs, or writes an `unknown` that un-readies vLLM) and started again.
A child's last `unknown` becomes `misconfigured` (its own trouble, which vLLM's probes ignore). SIGTERM or
SIGINT goes to the child (SIGKILL after `--stop-grace`). One stderr line per restart; no argv, no environment.
Standard library only (deploykit's verdict writer imported when needed, done without if it cannot be): it
must run when the canary's code cannot. As PID 1 it reaps orphans. docs/deploy.md has the details.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from deploykit import exit_codes
from deploykit.render.pod_probe import DEFAULT_MAX_VERDICT_AGE_S, FUTURE_MTIME_TOLERANCE_S, read_verdict

PROG = "deploykit canary keeper"


@dataclass(frozen=True)
class KeeperOptions:
    command: Sequence[str]
    verdict_file: str
    max_verdict_age_s: float = DEFAULT_MAX_VERDICT_AGE_S
    backoff_start_s: float = 1.0
    backoff_cap_s: float = 60.0
    reset_after_s: float = 600.0  # a run this long was healthy: the backoff starts afresh
    check_every_s: float = 5.0
    stop_grace_s: float = 20.0  # under Kubernetes' default terminationGracePeriodSeconds (30 s)


def next_backoff(previous_s: float | None, ran_s: float, options: KeeperOptions) -> float:
    """The wait before the next start: the first after a long run (or ever), else the last doubled, capped."""
    if previous_s is None or ran_s >= options.reset_after_s:
        return min(options.backoff_start_s, options.backoff_cap_s)
    return min(previous_s * 2, options.backoff_cap_s)


def how_it_ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(number).name}"
        return f"was killed by signal {number}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


@dataclass
class _Child:
    process: subprocess.Popen[bytes]
    started: float  # monotonic
    started_wall: float  # compared with the verdict's mtime
    killed_why: str | None = None


class Keeper:
    """The loop (`run`) and its state."""

    def __init__(self, options: KeeperOptions, say: Callable[[str], None]) -> None:
        self.options, self.say = options, say
        self.child: _Child | None = None
        self.restarts = 0
        self.backoff_s: float | None = None
        self.next_start = 0.0
        self.stop_signal: int | None = None
        self.stop_deadline: float | None = None
        self.forced = False
        self._wake = -1

    def run(self) -> int:
        self._install_signals()
        while True:
            self._reap()
            now = time.monotonic()
            if self.stop_signal is not None:
                if self.child is None:
                    return exit_codes.FAILED if self.forced else exit_codes.OK
                self._stop_child(now)
            elif self.child is None:
                if now >= self.next_start:
                    self._start(now)
            else:
                self._check_stale()
            self._sleep()

    def _install_signals(self) -> None:
        """A self-pipe: every signal (SIGCHLD too) writes a byte select() wakes on: the loop sleeps until
        something happens or a check is due, it never polls."""
        read_fd, write_fd = os.pipe()
        for fd in (read_fd, write_fd):
            os.set_blocking(fd, False)
        self._wake = read_fd
        signal.set_wakeup_fd(write_fd)

        def on_stop(signum: int, frame: object) -> None:
            if self.stop_signal is None:
                self.stop_signal = signum

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)

    def _sleep(self) -> None:
        now = time.monotonic()
        deadlines = [now + self.options.check_every_s]
        if self.child is None and self.stop_signal is None:
            deadlines.append(self.next_start)
        if self.stop_deadline is not None and not self.forced:  # (after SIGKILL, SIGCHLD wakes it)
            deadlines.append(self.stop_deadline)
        with contextlib.suppress(InterruptedError):
            select.select([self._wake], [], [], max(0.0, min(deadlines) - now))
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self._wake, 512):
                pass

    def _start(self, now: float) -> None:
        try:  # its own process group: a kill reaches what it started too
            process = subprocess.Popen(self.options.command, stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            self._schedule(0.0, f"could not be started ({type(exc).__name__}: {exc.strerror or exc})")
            return
        self.child = _Child(process, now, time.time())

    def _check_stale(self) -> None:
        child = self.child
        if child is None or child.killed_why is not None:
            return
        mtime = read_verdict(self.options.verdict_file)[1]
        if mtime is None:
            with contextlib.suppress(OSError):
                mtime = os.stat(self.options.verdict_file, follow_symlinks=False).st_mtime
        now = time.time()
        # A verdict dated in the future never ages: not trusted (as if none was written), never fresh.
        trusted = mtime if mtime is not None and mtime <= now + FUTURE_MTIME_TOLERANCE_S else None
        quiet = now - max(child.started_wall, trusted or 0.0)
        if quiet > self.options.max_verdict_age_s:
            dated = ""
            if mtime is not None and trusted is None:
                dated = f" (its verdict is dated {mtime - now:.0f} s in the future: not trusted)"
            child.killed_why = (
                f"wrote no verdict for {quiet:.0f} s (over {self.options.max_verdict_age_s:g}){dated}: "
                "hung, killed"
            )
            self._signal_child(signal.SIGKILL)

    def _stop_child(self, now: float) -> None:
        """The stop passed on once (with SIGCONT: a stopped child cannot act on it); SIGKILL after grace."""
        if self.stop_deadline is None:
            assert self.stop_signal is not None
            self.say(f"{PROG}: {signal.Signals(self.stop_signal).name} received: stopping the canary")
            self._signal_child(self.stop_signal)
            self._signal_child(signal.SIGCONT)
            self.stop_deadline = now + self.options.stop_grace_s
        elif now >= self.stop_deadline and not self.forced:
            self.say(f"{PROG}: the canary did not stop within {self.options.stop_grace_s:g} s: killed")
            self.forced = True
            self._signal_child(signal.SIGKILL)

    def _signal_child(self, sig: int) -> None:
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.process.pid, sig)

    def _reap(self) -> None:
        """Every ended child (as PID 1 it inherits orphans); ours ends the current run."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.child
            if child is not None and pid == child.process.pid:
                child.process.returncode = os.waitstatus_to_exitcode(status)
                self.child = None
                if self.stop_signal is not None:
                    self.say(f"{PROG}: the canary {how_it_ended(status)}; stopped")
                else:
                    ran = time.monotonic() - child.started
                    why = child.killed_why or how_it_ended(status)
                    self._schedule(ran, f"(pid {pid}) {why} after {ran:.1f} s")

    def _schedule(self, ran_s: float, why: str) -> None:
        self.backoff_s = next_backoff(self.backoff_s, ran_s, self.options)
        self.next_start = time.monotonic() + self.backoff_s
        self.restarts += 1
        self._leave_no_unknown(why)
        self.say(f"{PROG}: the canary {why}; restart {self.restarts} in {self.backoff_s:g} s")

    def _leave_no_unknown(self, why: str) -> None:
        """A last `unknown` ("nothing judges the server now") would un-ready vLLM; the canary is started
        again, so its trouble is its own: `misconfigured`, which vLLM's probes ignore."""
        verdict = read_verdict(self.options.verdict_file)[0]
        if verdict is None or verdict.get("status") != "unknown":
            return
        diagnosis = (
            f"the canary {why}; its keeper starts it again (restart {self.restarts}): vLLM is left alone"
        )
        try:
            from deploykit.canary.verdict import write_verdict_file

            verdict = {"status": "misconfigured", "diagnosis": diagnosis, "written_at": time.time()}
            verdict |= {"pid": os.getpid(), "final": False, "keeper_restarts": self.restarts}
            write_verdict_file(self.options.verdict_file, verdict)
        except Exception as exc:  # the canary's own code may not import: the keeper goes on
            self.say(f"{PROG}: the canary's last `unknown` verdict stays ({type(exc).__name__})")


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: want seconds over 0")
    return value


def parse(argv: Sequence[str]) -> KeeperOptions:
    parser = argparse.ArgumentParser(prog="python3 -m deploykit.render.canary_keeper", description=__doc__)
    parser.add_argument("--verdict-file", required=True)
    defaults = KeeperOptions((), "")
    flags = ("max_verdict_age", "backoff_start", "backoff_cap", "reset_after", "check_every", "stop_grace")
    for flag in flags:
        default = getattr(defaults, f"{flag}_s")
        parser.add_argument(
            f"--{flag.replace('_', '-')}", type=_seconds, default=default, help=f"{default:g} s"
        )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the canary's command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("the canary's command is missing (after --)")
    seconds = {f"{flag}_s": getattr(args, flag) for flag in flags}
    return KeeperOptions(command=command, verdict_file=args.verdict_file, **seconds)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    return Keeper(options, say=lambda line: print(line, file=sys.stderr, flush=True)).run()


if __name__ == "__main__":
    sys.exit(main())
