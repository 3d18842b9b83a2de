"""The rendered canary unit's `ExecStopPost=+`: restart the server unit when, and only when, the canary
ended with its corruption verdict (`deploykit canary --exit-on-corruption` exits 3 at the first wrong
answer; slowness, misses, a crash or a stop never exit 3) or a hung engine (exit 5: requests waited with no
token produced; it counts against the same cap) — and at most `--max-restarts` times within
`--window-s` seconds.

systemd sets `$EXIT_CODE` (`exited`, `killed`, ...) and `$EXIT_STATUS` for ExecStopPost= commands; this
reads them from its environment, so no shell and no `$` expansion are involved. Run as
`python -m deploykit.render.on_corruption --restart UNIT.service [--state-dir DIR --max-restarts N
--window-s S --profile NAME]`.

Restart storms are bounded. With `--state-dir`, each corruption restart is written (a Unix time per line)
to `DIR/corruption-restarts`. A corruption verdict when `--max-restarts` restarts already happened within
the last `--window-s` seconds does not restart the server: it stops it (`systemctl stop --no-block`), so a
model that turns corrupt again after every restart stops serving wrong answers instead of looping, and an
operator decides (`systemctl start UNIT` after a look; the window forgets old restarts by itself). Each
decision is one journal line and one row in deploykit's results store (`command=canary`, stage
`corruption:restart` or `corruption:stopped`, verdict `fail`), written as the owner of the state
directory (the service user) so the store stays the service's own. Standard library only, except the row,
which imports deploykit's store in a child process; a row that cannot be written never blocks the decision.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from deploykit.canary import defaults
from deploykit.exit_codes import CORRUPT, HUNG

# The same restart budget as serve's in-process canary (constants only: no serve, no canary machinery).
MAX_RESTARTS = defaults.MAX_RESTARTS_PER_HOUR
WINDOW_S = int(defaults.RESTART_WINDOW_S)
LEDGER_NAME = "corruption-restarts"
STAGE_RESTART = "corruption:restart"
STAGE_STOPPED = "corruption:stopped"

Record = Callable[[str, str, dict[str, float]], None]


def corrupt_verdict(env: Mapping[str, str], code: int = CORRUPT, hung_code: int = HUNG) -> bool:
    """The canary ended with a verdict that restarts the server: corrupt output, or a hung engine."""
    return env.get("EXIT_CODE") == "exited" and env.get("EXIT_STATUS") in (str(code), str(hung_code))


def restart_command(unit: str) -> list[str]:
    # --no-block: this runs inside the canary's own stop, and the canary is part of the unit restarted.
    return ["systemctl", "restart", "--no-block", unit]


def stop_command(unit: str) -> list[str]:
    return ["systemctl", "stop", "--no-block", unit]


def read_ledger(path: Path) -> list[float]:
    """The restart times in the ledger; unreadable lines (and a missing file) count as nothing."""
    try:
        text = path.read_text()
    except OSError:
        return []
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


def write_ledger(path: Path, times: Sequence[float]) -> None:
    """Atomically: a crash mid-write leaves the old ledger."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text("".join(f"{t:.3f}\n" for t in times))
    os.replace(tmp, path)


def record_row_as_owner(state_dir: Path, profile: str | None, env: Mapping[str, str]) -> Record:
    """A `Record` that stores the row from a child process running as the state directory's owner."""

    def record(stage: str, diagnosis: str, timings: dict[str, float]) -> None:
        argv = [sys.executable, "-m", "deploykit.render.on_corruption", "--record-row", stage]
        argv += ["--diagnosis", diagnosis, "--restarts", str(int(timings.get("restarts", 0)))]
        argv += ["--max-restarts", str(int(timings.get("max_restarts", 0)))]
        argv += ["--window-s", str(int(timings.get("window_s", 0)))]
        if profile:
            argv += ["--profile", profile]
        owner = state_dir.stat()
        as_owner = os.geteuid() == 0 and owner.st_uid != 0
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
    from deploykit.store import ResultRecord, open_store

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
    return 0


def main(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    run: Callable[[list[str]], int] = lambda command: subprocess.run(command, check=False).returncode,
    record: Record | None = None,
    now: Callable[[], float] = time.time,
) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploykit.render.on_corruption", description=__doc__)
    parser.add_argument("--restart", metavar="UNIT", help="the server unit to restart")
    parser.add_argument("--exit-status", type=int, default=CORRUPT, help="the canary's corruption code")
    parser.add_argument("--hung-exit-status", type=int, default=HUNG, help="the canary's hung-engine code")
    parser.add_argument("--state-dir", type=Path, help=f"the service's state directory (holds {LEDGER_NAME})")
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
    if not corrupt_verdict(env, args.exit_status, args.hung_exit_status):
        print(f"canary ended ({ended}): not a corruption verdict, {args.restart} left alone")
        return 0
    what = (
        "the engine is hung"
        if env.get("EXIT_STATUS") == str(args.hung_exit_status)
        else "the output is corrupt"
    )
    if args.state_dir is None:  # no ledger: no cap
        print(f"canary ended ({ended}): {what}, restarting {args.restart}")
        return run(restart_command(args.restart))
    if record is None:
        record = record_row_as_owner(args.state_dir, args.profile, env)
    ledger = args.state_dir / LEDGER_NAME
    moment = now()
    times = recent_restarts(read_ledger(ledger), moment, args.window_s)
    limits = {"max_restarts": float(args.max_restarts), "window_s": float(args.window_s)}
    window = f"{args.window_s:.0f} s"
    if len(times) >= args.max_restarts:
        line = (
            f"canary ended ({ended}): {what} again after {len(times)} corruption restarts of "
            f"{args.restart} within {window} (the cap is {args.max_restarts}): stopping {args.restart} and "
            f"leaving it stopped, no restart loop; look at the journal and the rows, then "
            f"`systemctl start {args.restart}`"
        )
        print(line)
        record(STAGE_STOPPED, line, {"restarts": float(len(times)), **limits})
        return run(stop_command(args.restart))
    try:
        write_ledger(ledger, [*times, moment])
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
