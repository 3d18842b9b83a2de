"""The rendered server unit's `ExecStartPre=`: vLLM starts only when the release installed in the prefix is
the one the unit was planned for. A plan's decisions (fixes, runner, launch flags, the argv's validation)
belong to one vLLM release; started on another, the server would run with another release's decisions.

Run as `PREFIX/bin/python -P -m deploykit.render.vllm_release --planned VERSION` with the unit's own
environment, so it reads the vLLM that `PREFIX/bin/vllm` would import (`-P`: not the working directory, which
the service user writes; PYTHONPATH as vLLM sees it). Releases compare as `deploykit plan` compares them
(`0.32.0+cpu` is 0.32.0). A mismatch, or no vLLM at all, is one journal line and exit 2 (a plan refusal:
docs/exit-codes.md). Standard library and deploykit's ground floor only: no vLLM import.
"""

from __future__ import annotations

import argparse
import sys

from deploykit import exit_codes
from deploykit.installed import installed_vllm_version
from deploykit.render.escape import comment
from deploykit.vllm_compat import same_release

MODULE = "deploykit.render.vllm_release"


def refusal(planned: str, installed: str | None, prefix: str) -> str | None:
    """Why the unit must not start vLLM, in one line; None when `installed` is the planned release."""
    if installed is not None and same_release(planned, installed):
        return None
    found = f"vLLM {installed}" if installed else "no vLLM"
    return comment(
        f"deploykit: this unit was planned for vLLM {planned}, but {prefix} has {found} installed: vLLM not "
        f"started; install vLLM {planned} there, or plan and render the unit again for this host "
        "(deploykit render systemd)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    parser.add_argument("--planned", required=True, help="the vLLM version the unit was planned for")
    args = parser.parse_args(argv)
    why = refusal(args.planned, installed_vllm_version(), sys.prefix)
    if why is None:
        return exit_codes.OK
    print(why, file=sys.stderr)
    return exit_codes.USAGE


if __name__ == "__main__":
    sys.exit(main())
