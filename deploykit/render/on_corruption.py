"""The rendered canary unit's `ExecStopPost=+`: restart the server unit when, and only when, the canary
ended with a status that asks for it (`--exit-status`, repeatable: `deploykit canary --exit-on-corruption`
exits 3 at the first wrong answer and 5 on a hung engine — requests waited with no token produced;
slowness, misses, a crash or a stop never do) — and at most `--max-restarts` times within `--window-s`
seconds, corruption and hangs counted against the same cap.

It runs as root, so it trusts nothing the service user can write. The unit runs it as `python -I -m ...`
(isolated: the working directory, which is the service's state directory, is not on `sys.path`, and no
PYTHON* variable is read), so a module planted there is never imported. Its restart ledger lives in a
root-owned directory (`--ledger-dir`, mode 0700, created here, refused when anyone else owns it or may
write it), never in the state directory, and every open is relative to that directory's descriptor with
O_NOFOLLOW: a symbolic link placed at the ledger's path is refused, never followed, and a ledger it cannot
trust stops the server (fail closed: the cap cannot hold without it) instead of restarting it uncounted.

systemd sets `$EXIT_CODE` (`exited`, `killed`, ...) and `$EXIT_STATUS` for ExecStopPost= commands; this
reads them from its environment, so no shell and no `$` expansion are involved. Run as
`python -I -m deploykit.render.on_corruption --restart UNIT.service [--exit-status N ...] [--ledger-dir DIR
--state-dir DIR --max-restarts N --window-s S --profile NAME]`.

Restart storms are bounded. With `--ledger-dir`, each corruption restart is written (a Unix time per
line) to `DIR/UNIT` (the server unit's name). A corruption verdict when `--max-restarts` restarts already
happened within the last `--window-s` seconds does not restart the server: it stops it (`systemctl stop
--no-block`), so a model that turns corrupt again after every restart stops serving wrong answers instead
of looping, and an operator decides (`systemctl start UNIT` after a look; the window forgets old restarts
by itself). Each decision is one journal line and one row in deploykit's results store (`command=canary`,
stage `corruption:restart` or `corruption:stopped`, verdict `fail`), written by a child process (again
`python -I`) running as the owner of `--state-dir` (the service user) so the store stays the service's
own. Standard library only, except the row, which imports deploykit's store in the child; a row that
cannot be written never blocks the decision.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from deploykit.canary import defaults
from deploykit.exit_codes import CORRUPT, HUNG, OK

# The same restart budget as serve's in-process canary (constants only: no serve, no canary machinery).
MAX_RESTARTS = defaults.MAX_RESTARTS_PER_HOUR
WINDOW_S = int(defaults.RESTART_WINDOW_S)
# Root's own directory for the ledgers of every rendered profile (one file per server unit); the service
# users can neither write nor list it.
LEDGER_DIR = "/var/lib/deploykit-corruption"
LEDGER_MAX_BYTES = 64 * 1024
STAGE_RESTART = "corruption:restart"
STAGE_STOPPED = "corruption:stopped"

Record = Callable[[str, str, dict[str, float]], None]


class LedgerRefused(OSError):
    """The ledger directory or file is not root's own regular file: nothing there is read or written."""


# The canary's exit statuses that restart the server, under one cap: corruption, and a hung engine.
RESTART_EXIT_STATUSES: tuple[int, ...] = (CORRUPT, HUNG)


def restart_verdict(env: Mapping[str, str], codes: Sequence[int] = RESTART_EXIT_STATUSES) -> bool:
    """Did the canary exit (not get killed) with one of the statuses that restart the server?"""
    return env.get("EXIT_CODE") == "exited" and env.get("EXIT_STATUS") in {str(code) for code in codes}


def restart_command(unit: str) -> list[str]:
    # --no-block: this runs inside the canary's own stop, and the canary is part of the unit restarted.
    return ["systemctl", "restart", "--no-block", unit]


def stop_command(unit: str) -> list[str]:
    return ["systemctl", "stop", "--no-block", unit]


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_ledger_dir(path: Path) -> int:
    """A descriptor of `path`, created (0700) when missing; refused unless it is a real directory that this
    process's user owns and nobody else may write (a link at `path` is refused, not followed)."""
    if not path.is_absolute():
        raise LedgerRefused(f"{path}: the ledger directory must be an absolute path")
    parent = os.open(path.parent, _DIR_FLAGS)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path.name, 0o700, dir_fd=parent)
        try:
            fd = os.open(path.name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            raise LedgerRefused(f"{path}: not a directory of its own ({exc.strerror})") from None
    finally:
        os.close(parent)
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        raise LedgerRefused(
            f"{path}: owned by uid {info.st_uid} with mode {stat.S_IMODE(info.st_mode):o}; the ledger "
            f"directory must be uid {os.geteuid()}'s alone (mode 0700)"
        )
    return fd


def read_ledger(directory: int, name: str) -> list[float]:
    """The restart times in the ledger; a missing file counts as nothing, unreadable lines too; anything but
    a regular file (a link, a FIFO) is refused."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise LedgerRefused(f"{name}: not a regular file ({exc.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LedgerRefused(f"{name}: not a regular file")
        text = os.read(fd, LEDGER_MAX_BYTES).decode("ascii", errors="replace")
    finally:
        os.close(fd)
    times = []
    for line in text.split():
        try:
            times.append(float(line))
        except ValueError:
            continue
    return times


def recent_restarts(times: Sequence[float], now: float, window_s: float) -> list[float]:
    """The restarts inside the window ending now (a time in the future, a clock step, counts too)."""
    return sorted(t for t in times if t > now - window_s)


def past_restarts(ledger_dir: Path, unit: str, now: float, window_s: float) -> list[float]:
    """`unit`'s restarts within the window, from its ledger in root's own directory (OSError: unusable)."""
    directory = open_ledger_dir(ledger_dir)
    try:
        return recent_restarts(read_ledger(directory, unit), now, window_s)
    finally:
        os.close(directory)


def count_restart(ledger_dir: Path, unit: str, times: Sequence[float]) -> None:
    directory = open_ledger_dir(ledger_dir)
    try:
        write_ledger(directory, unit, times)
    finally:
        os.close(directory)


def write_ledger(directory: int, name: str, times: Sequence[float]) -> None:
    """Atomically, inside the directory's descriptor: a new file (O_EXCL, O_NOFOLLOW, 0600) renamed over the
    old one, so a crash mid-write leaves the old ledger and no link is ever written through."""
    tmp = f".{name}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=directory)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=directory)
    try:
        os.write(fd, "".join(f"{t:.3f}\n" for t in times).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=directory, dst_dir_fd=directory)


def record_row_as_owner(state_dir: Path, profile: str | None, env: Mapping[str, str]) -> Record:
    """A `Record` that stores the row from a child process running as the state directory's owner."""

    def record(stage: str, diagnosis: str, timings: dict[str, float]) -> None:
        # -I: not even the service user's own state directory is put on sys.path.
        argv = [sys.executable, "-I", "-m", "deploykit.render.on_corruption", "--record-row", stage]
        argv += ["--diagnosis", diagnosis, "--restarts", str(int(timings.get("restarts", 0)))]
        argv += ["--max-restarts", str(int(timings.get("max_restarts", 0)))]
        argv += ["--window-s", str(int(timings.get("window_s", 0)))]
        if profile:
            argv += ["--profile", profile]
        try:
            owner = state_dir.lstat()
        except OSError as exc:
            print(f"the {stage} row was not stored: {state_dir}: {exc.strerror}")
            return
        as_owner = os.geteuid() == 0
        if as_owner and (not stat.S_ISDIR(owner.st_mode) or owner.st_uid == 0):
            # Root writes nothing into the service's directory itself (a link there, or a store it follows).
            print(f"the {stage} row was not stored: {state_dir} is not a directory of the service user's own")
            return
        try:
            done = subprocess.run(
                argv,
                env=dict(env),
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                cwd=state_dir,
                user=owner.st_uid if as_owner else None,
                group=owner.st_gid if as_owner else None,
                extra_groups=[] if as_owner else None,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"the {stage} row was not stored: {exc}")
            return
        if done.returncode != 0:
            print(f"the {stage} row was not stored: {(done.stderr or done.stdout).strip()[-300:]}")

    return record


def store_row(stage: str, diagnosis: str, profile: str | None, timings: dict[str, float]) -> int:
    from deploykit.results.record import ResultRecord
    from deploykit.results.stores import open_store

    store = open_store()
    try:
        store.add(
            ResultRecord(
                command="canary",
                profile_name=profile,
                verdict="fail",
                stage=stage,
                diagnosis=diagnosis,
                timings={key: float(value) for key, value in timings.items()},
            )
        )
    finally:
        store.close()
    return OK


def main(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    run: Callable[[list[str]], int] = lambda command: subprocess.run(command, check=False).returncode,
    record: Record | None = None,
    now: Callable[[], float] = time.time,
) -> int:
    parser = argparse.ArgumentParser(prog="python -I -m deploykit.render.on_corruption", description=__doc__)
    parser.add_argument("--restart", metavar="UNIT", help="the server unit to restart")
    parser.add_argument(
        "--exit-status",
        type=int,
        action="append",
        help=(
            f"a canary exit status that restarts the server (repeatable; default {CORRUPT}, corruption, "
            f"and {HUNG}, a hung engine)"
        ),
    )
    parser.add_argument("--ledger-dir", type=Path, help="root's own directory for the restart ledger")
    parser.add_argument(
        "--state-dir", type=Path, help="the service's state directory (its owner stores rows)"
    )
    parser.add_argument("--max-restarts", type=int, default=MAX_RESTARTS, help="restarts allowed per window")
    parser.add_argument("--window-s", type=float, default=WINDOW_S, help="the window, in seconds")
    parser.add_argument("--profile", help="the profile's name, for the row")
    parser.add_argument("--record-row", metavar="STAGE", help=argparse.SUPPRESS)
    parser.add_argument("--diagnosis", default="", help=argparse.SUPPRESS)
    parser.add_argument("--restarts", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.record_row:  # the child that stores a decision's row, as the service user
        timings = {"restarts": args.restarts, "max_restarts": args.max_restarts, "window_s": args.window_s}
        return store_row(args.record_row, args.diagnosis, args.profile, timings)
    if not args.restart:
        parser.error("--restart UNIT is required")
    env = os.environ if env is None else env
    ended = f"{env.get('EXIT_CODE', '?')} {env.get('EXIT_STATUS', '?')}"
    if not restart_verdict(env, args.exit_status or RESTART_EXIT_STATUSES):
        print(f"canary ended ({ended}): not a corruption verdict, {args.restart} left alone")
        return OK
    what = "the engine is hung" if env.get("EXIT_STATUS") == str(HUNG) else "the output is corrupt"
    if args.ledger_dir is None:  # no ledger: no cap
        print(f"canary ended ({ended}): {what}, restarting {args.restart}")
        return run(restart_command(args.restart))
    if record is None:
        record = (
            record_row_as_owner(args.state_dir, args.profile, env)
            if args.state_dir is not None
            else lambda stage, diagnosis, timings: None
        )
    ledger = args.ledger_dir / args.restart
    moment = now()
    limits = {"max_restarts": float(args.max_restarts), "window_s": float(args.window_s)}
    window = f"{args.window_s:.0f} s"
    try:
        times = past_restarts(args.ledger_dir, args.restart, moment, args.window_s)
    except OSError as exc:
        # Fail closed: without a ledger it can trust, the cap cannot hold, so no uncounted restart loop.
        line = (
            f"canary ended ({ended}): {what}, but the restart ledger {ledger} cannot be "
            f"trusted ({exc}); it is left alone, and {args.restart} is stopped rather than restarted "
            f"uncapped; look at {args.ledger_dir}, then `systemctl start {args.restart}`"
        )
        print(line)
        record(STAGE_STOPPED, line, {"restarts": 0.0, **limits})
        return run(stop_command(args.restart))
    if len(times) >= args.max_restarts:
        line = (
            f"canary ended ({ended}): {what} again after {len(times)} corruption restarts of "
            f"{args.restart} within {window} (the cap is {args.max_restarts}): stopping {args.restart} and "
            "leaving it stopped, no restart loop; look at the journal and the rows, then "
            f"`systemctl start {args.restart}`"
        )
        print(line)
        record(STAGE_STOPPED, line, {"restarts": float(len(times)), **limits})
        return run(stop_command(args.restart))
    try:
        count_restart(args.ledger_dir, args.restart, [*times, moment])
    except OSError as exc:
        print(f"cannot write {ledger} ({exc}): this restart is not counted")
    line = (
        f"canary ended ({ended}): {what}, restarting {args.restart} (corruption restart "
        f"{len(times) + 1} of at most {args.max_restarts} within {window})"
    )
    print(line)
    record(STAGE_RESTART, line, {"restarts": float(len(times) + 1), **limits})
    return run(restart_command(args.restart))


if __name__ == "__main__":
    sys.exit(main())
