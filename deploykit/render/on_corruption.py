"""The rendered canary unit's `ExecStopPost=+`: restart the server unit when, and only when, the canary
ended with its corruption verdict (`deploykit canary --exit-on-corruption` exits 3 at the first wrong
answer; slowness, misses, a crash or a stop never exit 3).

systemd sets `$EXIT_CODE` (`exited`, `killed`, ...) and `$EXIT_STATUS` for ExecStopPost= commands; this
reads them from its environment, so no shell and no `$` expansion are involved. Run as
`python -m deploykit.render.on_corruption --restart UNIT.service`. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

EXIT_CORRUPT = 3  # deploykit.serve.canary.EXIT_CORRUPT (render must not import serve)


def corrupt_verdict(env: Mapping[str, str], code: int = EXIT_CORRUPT) -> bool:
    return env.get("EXIT_CODE") == "exited" and env.get("EXIT_STATUS") == str(code)


def restart_command(unit: str) -> list[str]:
    # --no-block: this runs inside the canary's own stop, and the canary is part of the unit restarted.
    return ["systemctl", "restart", "--no-block", unit]


def main(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    run: Callable[[list[str]], int] = lambda command: subprocess.run(command, check=False).returncode,
) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploykit.render.on_corruption", description=__doc__)
    parser.add_argument("--restart", required=True, metavar="UNIT", help="the server unit to restart")
    parser.add_argument("--exit-status", type=int, default=EXIT_CORRUPT, help="the canary's corruption code")
    args = parser.parse_args(argv)
    env = os.environ if env is None else env
    ended = f"{env.get('EXIT_CODE', '?')} {env.get('EXIT_STATUS', '?')}"
    if not corrupt_verdict(env, args.exit_status):
        print(f"canary ended ({ended}): not a corruption verdict, {args.restart} left alone")
        return 0
    print(f"canary ended ({ended}): the output is corrupt, restarting {args.restart}")
    return run(restart_command(args.restart))


if __name__ == "__main__":
    sys.exit(main())
