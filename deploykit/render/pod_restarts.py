"""The pod's cap on corruption restarts (issue 34), as the systemd unit has one (`on_corruption`): at most
`MAX_RESTARTS` restarts of the vLLM container for corruption (or a hung engine) within `WINDOW_S`; past
that, liveness stops asking for restarts and readiness keeps the pod out of the Service, saying why,
instead of restarting vLLM in a loop (a model that turns corrupt again after every restart, or one user
request with NaN logits every few minutes).

The ledger is one small file in a directory that outlives the vLLM container (an `emptyDir` of the pod,
mounted read-write in the vLLM container only), one line per vLLM process the liveness probe failed for
corruption: `restart START AT` (START: that process's start, so the probe's repeated failures before the
kubelet acts count once) or `capped START AT` (the cap held this process: readiness fails for it). A new pod
starts with an empty ledger (delete the pod to start afresh after a look). Standard library only: it runs in
the vLLM image with `pod_probe`.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

MAX_RESTARTS = 3
"""The same budget as the systemd unit's (`deploykit.canary.defaults.MAX_RESTARTS_PER_HOUR`; not imported:
standard library only here, a test holds them equal)."""
WINDOW_S = 3600.0
LEDGER_NAME = "corruption-restarts"
LEDGER_MAX_BYTES = 64 * 1024


@dataclass(frozen=True)
class Entry:
    kind: str  # "restart" or "capped"
    process: str  # the vLLM process's start, as written (two decimals)
    at: float


def process_key(process_start: float) -> str:
    return f"{process_start:.2f}"


def read_ledger(directory: str) -> list[Entry]:
    """The ledger's entries (a missing file: none; unreadable lines are skipped). OSError when the file
    cannot be read, or is not a regular file (never followed through a link)."""
    path = os.path.join(directory, LEDGER_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    try:
        text = os.read(fd, LEDGER_MAX_BYTES).decode("ascii", errors="replace")
    finally:
        os.close(fd)
    entries = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] in ("restart", "capped"):
            with contextlib.suppress(ValueError):
                entries.append(Entry(words[0], words[1], float(words[2])))
    return entries


def write_ledger(directory: str, entries: list[Entry]) -> None:
    """Atomically: a temporary file in the same directory, renamed over the ledger."""
    path = os.path.join(directory, LEDGER_NAME)
    temporary = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, "".join(f"{e.kind} {e.process} {e.at:.3f}\n" for e in entries).encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)


def restart_or_hold(
    directory: str,
    process_start: float,
    now: float,
    max_restarts: int = MAX_RESTARTS,
    window_s: float = WINDOW_S,
) -> tuple[bool, str]:
    """For a liveness probe about to fail on a corruption (or hung) verdict about the process that started
    at `process_start`: (restart it?, in words). Counts the restart once per process; past the cap, holds
    it (records `capped`, so readiness keeps it out). OSError: the ledger cannot be used."""
    key = process_key(process_start)
    entries = read_ledger(directory)
    if any(e.kind == "restart" and e.process == key for e in entries):
        return True, "this restart is already counted"
    recent = [e for e in entries if e.kind == "restart" and e.at > now - window_s]
    window = f"{window_s:.0f} s"
    if len(recent) >= max_restarts:
        if not any(e.kind == "capped" and e.process == key for e in entries):
            write_ledger(directory, [*_kept(entries, now, window_s), Entry("capped", key, now)])
        return False, capped_words(len(recent), max_restarts, window)
    write_ledger(directory, [*_kept(entries, now, window_s), Entry("restart", key, now)])
    return True, f"corruption restart {len(recent) + 1} of at most {max_restarts} within {window}"


def capped_reason(
    directory: str,
    process_start: float,
    now: float,
    window_s: float = WINDOW_S,
    max_restarts: int = MAX_RESTARTS,
) -> str | None:
    """Why readiness must fail for this process (the cap held it), or None."""
    key = process_key(process_start)
    entries = read_ledger(directory)
    if not any(e.kind == "capped" and e.process == key for e in entries):
        return None
    recent = [e for e in entries if e.kind == "restart" and e.at > now - window_s]
    return capped_words(len(recent), max_restarts, f"{window_s:.0f} s")


def capped_words(restarts: int, max_restarts: int, window: str) -> str:
    return (
        f"corrupt again after {restarts} corruption restarts within {window} (the cap is {max_restarts}): "
        "vLLM is left running but out of the Service, no restart loop; look at the canary's log, then "
        "delete the pod to start afresh"
    )


def _kept(entries: list[Entry], now: float, window_s: float) -> list[Entry]:
    """What the ledger keeps: the window's restarts and every `capped` mark (a few lines at most)."""
    return [e for e in entries if e.kind == "capped" or e.at > now - window_s][-64:]
