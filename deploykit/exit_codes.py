"""Every process exit status deploykit uses, in one place: a script, a systemd unit or a Kubernetes probe
acts on these numbers, so one number never carries two meanings. The table in docs/exit-codes.md is
this module in words; `tests/test_exit_codes.py` holds the two to each other, and finds a status written as
a number anywhere else in the package.
"""

from __future__ import annotations

OK = 0
"""The command did what it was asked: a smoke or trace passed, a render written, a canary stopped clean."""

FAILED = 1
"""The check ran and the deployment failed it (smoke FAIL, trace found a problem), or the work failed."""

USAGE = 2
"""The input was refused before any work started: a bad flag, profile, facts file or address."""

CORRUPT = 3
"""The canary saw corrupt output (`--exit-on-corruption`); systemd and the chart restart vLLM on it."""

NO_GPU = 4
"""`deploykit probe` found no NVIDIA GPU (or no NVML driver) on this machine."""

HUNG = 5
"""The canary saw a hung engine (`--exit-on-corruption`): requests waited with no token produced for the
bound; systemd and the chart restart vLLM on it, under the same cap as corruption."""

HOLD = 6
"""`deploykit gate` held the candidate back: its answers drift from the baseline's, or it is slower. (A
candidate that fails on its own is `FAILED`.)"""

INTERRUPTED = 130
"""Stopped by Ctrl-C or SIGINT (128 + signal 2, the shell's convention: `for_signal`)."""

_SIGNAL_BASE = 128


def for_signal(signum: int) -> int:
    """The status of a process stopped by signal `signum`, as a shell reports it: 128 + N (SIGTERM: 143)."""
    return _SIGNAL_BASE + signum


MEANINGS: dict[int, str] = {
    OK: "success",
    FAILED: "the deployment failed a check, or the work failed",
    USAGE: "input refused before any work started",
    CORRUPT: "the canary saw corrupt output",
    NO_GPU: "probe found no NVIDIA GPU",
    HUNG: "the canary saw a hung engine",
    HOLD: "the gate held the candidate: drift or slower",
    INTERRUPTED: "interrupted (Ctrl-C)",
}
