"""The vLLM container's liveness and readiness probes (Kubernetes exec probes), which read the canary
sidecar's verdict file instead of calling its port.

A probe on the sidecar's port kills a healthy vLLM whenever the sidecar is missing, crash-looping, not
pulled yet or slow. This one asks vLLM's own `/health`, then reads the verdict that `deploykit canary
--verdict-file PATH` rewrites after every run (on a volume both containers mount), and lets the verdict
fail the probe only when it is fresh: written after this vLLM process started, and not too long ago.

    python3 -m deploykit.render.pod_probe live|ready --health-url http://127.0.0.1:8000/health \\
        --verdict-file /run/deploykit/verdict.json [--timeout 5] [--max-verdict-age 600] \\
        [--ledger-dir /run/deploykit-ledger]

| situation                                                     | live | ready |
|---------------------------------------------------------------|------|-------|
| `/health` does not answer 200 within `--timeout`              | fail | fail  |
| no verdict file, or unreadable, malformed, unknown status     | pass | pass  |
| verdict written before the vLLM container's process started  | pass | pass  |
| verdict not rewritten for over `--max-verdict-age` seconds    | pass | pass  |
| verdict dated over 5 s in the future (a clock step, a forgery)| pass | pass  |
| fresh `corrupt`                                               | fail | fail  |
| fresh `hung` (requests waited, no token produced)             | fail | fail  |
| fresh `unreachable` (no answer, and no progress seen)         | pass | fail  |
| fresh `saturated` (answers late, vLLM's counters advancing)   | pass | pass  |
| fresh `unknown` (the canary stopped or crashed)               | pass | fail  |
| fresh `misconfigured` (the canary's setup, not vLLM's output)  | pass | pass  |
| fresh `starting` or `healthy`                                 | pass | pass  |

With `--ledger-dir`, a liveness failure on a fresh `corrupt` or `hung` verdict is a corruption restart,
counted (once per vLLM process) and capped: past 3 within an hour liveness passes and readiness fails for
that process, saying so (`pod_restarts`), so vLLM is never restarted in a loop.

Exit 0 passes, 1 fails; one line says why (the kubelet shows it in the pod's events). Standard library only,
and nothing else of deploykit but its exit statuses (deploykit.exit_codes, itself standard library only): it
runs in the vLLM image, with deploykit on PYTHONPATH as a zipped wheel.
`decide()` is the table (pure); the rest reads /health, the file and /proc.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import stat
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from deploykit import exit_codes

Mode = Literal["live", "ready"]

DEFAULT_TIMEOUT_S = 5.0
# The canary rewrites its verdict after every run (`--every`, 60 s by default; a run can take up to its
# request timeout, 120 s by default). Ten minutes is several intervals: a verdict that old means the canary
# is hung or gone, and a hung canary must not keep failing a healthy vLLM with what it once saw.
DEFAULT_MAX_VERDICT_AGE_S = 600.0
# /proc/stat's btime is whole seconds (rounded down), so the process start computed from it can be up to
# 1 s early: a verdict written less than that after the computed start may be the previous process's.
# Ignoring a fresh verdict for a second costs nothing (the canary rewrites it after every run).
START_SLACK_S = 1.0
# A verdict's mtime comes from the clock of the kernel that wrote it: on the pod's emptyDir (or a unit's
# state directory) the very clock `now` is read from, so it is never ahead but for timestamp granularity or
# a network filesystem's server a little ahead. Further in the future (a clock stepped back, a write that set
# the time) it never ages, and a verdict that never ages would turn the "hung or gone" check off for good:
# it is not trusted. Five seconds covers the skew and is all a future mtime can add to `--max-verdict-age`.
FUTURE_MTIME_TOLERANCE_S = 5.0
# A verdict is a few hundred bytes; anything much bigger is not one.
MAX_VERDICT_BYTES = 64 * 1024
MAX_REASON_CHARS = 400

# The statuses `deploykit canary` writes (deploykit.canary.state.Status: render must not import the canary).
# `unknown` is the last verdict of a canary that stopped or crashed (deploykit.canary.runner.final_verdict).
# `misconfigured` (the canary's own setup: a key refused, a name not served, a request refused as too long)
# fails neither probe: it says nothing of vLLM's output, and it is not `healthy` either (issue 34).
# `saturated` (the canary's answers late while vLLM's counters advance: a deep queue) fails neither: the
# replica is serving, and taking it out would strand its queue or, with one replica, the Service (issue 45).
STATUSES = frozenset(
    {"starting", "healthy", "saturated", "corrupt", "unreachable", "hung", "unknown", "misconfigured"}
)
# Which fresh statuses fail which probe. Liveness restarts the container: only corruption and a hung engine
# (which only a restart brings back; its /health may say 200 for hours) are worth that. Readiness only stops
# routing: a server the canary cannot get answers from, or that nothing judges any more, gets no traffic.
FAILING: dict[Mode, frozenset[str]] = {
    "live": frozenset({"corrupt", "hung"}),
    "ready": frozenset({"corrupt", "unreachable", "hung", "unknown"}),
}


@dataclass(frozen=True)
class Decision:
    passed: bool
    reason: str
    verdict_failed: bool = False
    """The failure is the canary's fresh verdict (corrupt, hung, ...), not vLLM's own /health."""


def decide(
    mode: Mode,
    *,
    health_ok: bool,
    verdict: Mapping[str, object] | None,
    verdict_mtime: float | None,
    process_start: float | None,
    now: float,
    max_verdict_age_s: float = DEFAULT_MAX_VERDICT_AGE_S,
    health_detail: str = "",
) -> Decision:
    """The probe's answer. `verdict` is the parsed file (None: missing, unreadable or not a JSON object),
    `verdict_mtime` its modification time, `process_start` the vLLM container's process start (None:
    unknown), all in Unix seconds like `now`. Any doubt about the verdict passes: the canary being down,
    late or confused must never restart or un-ready a vLLM whose own /health is fine."""
    if not health_ok:
        return Decision(False, _one_line(f"vLLM down: {health_detail or '/health did not answer 200'}"))
    if verdict is None or verdict_mtime is None:
        return Decision(True, "vLLM up; no readable canary verdict (the canary is down or not there yet)")
    status = verdict.get("status")
    if not isinstance(status, str) or status not in STATUSES:
        return Decision(True, _one_line(f"vLLM up; the verdict file's status {status!r} is unknown: ignored"))
    if process_start is None:
        return Decision(True, "vLLM up; the vLLM process's start time is unknown: the verdict is ignored")
    if verdict_mtime < process_start + START_SLACK_S:
        return Decision(True, f"vLLM up; the canary's {status} verdict predates this vLLM process: ignored")
    age = now - verdict_mtime
    if -age > FUTURE_MTIME_TOLERANCE_S:
        return Decision(
            True,
            f"vLLM up; the canary's {status} verdict is dated {-age:.0f} s in the future (a clock stepped "
            "back, or not the canary's write): not trusted, ignored",
        )
    if age > max_verdict_age_s:
        return Decision(
            True,
            f"vLLM up; the canary's {status} verdict is {age:.0f} s old (over {max_verdict_age_s:g} s: "
            "the canary is hung or gone): ignored",
        )
    if status in FAILING[mode]:
        diagnosis = verdict.get("diagnosis")
        reason = _one_line(f"canary says {status} ({max(age, 0):.0f} s ago): {diagnosis}")
        return Decision(False, reason, verdict_failed=True)
    return Decision(True, f"vLLM up; canary says {status} ({max(age, 0):.0f} s ago)")


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


# --- the I/O ------------------------------------------------------------------------------------------


def check_health(url: str, timeout_s: float) -> tuple[bool, str]:
    """(`url` answered 200 within `timeout_s` all told, what went wrong). A deadline for the whole request,
    not per socket operation: a server that trickles bytes is as down as one that hangs."""
    result: list[tuple[bool, str]] = []
    thread = threading.Thread(target=lambda: result.append(_get_status(url, timeout_s)), daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not result:
        return False, f"{url} did not answer within {timeout_s:g} s"
    return result[0]


def _get_status(url: str, timeout_s: float) -> tuple[bool, str]:
    # http.client, not urllib: no *_proxy variables of the image can send a loopback request to a proxy.
    try:
        parts = urllib.parse.urlsplit(url)
        connection: http.client.HTTPConnection
        if parts.scheme == "https":
            import ssl

            # Like the kubelet's own httpGet probes: vLLM's certificate is not checked, it is on loopback.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            connection = http.client.HTTPSConnection(
                parts.hostname or "", parts.port, timeout=timeout_s, context=context
            )
        elif parts.scheme == "http":
            connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout_s)
        else:
            return False, f"{url} is not an http(s) URL"
        try:
            connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""))
            status = connection.getresponse().status
        finally:
            connection.close()
    except TimeoutError:
        return False, f"{url} did not answer within {timeout_s:g} s"
    except Exception as exc:  # refused, reset, bad URL, bad answer: all "not 200"
        return False, f"{url}: {type(exc).__name__}: {exc}"
    if status != 200:
        return False, f"{url} answered HTTP {status}"
    return True, ""


def read_verdict(path: str) -> tuple[dict[str, object] | None, float | None]:
    """(the verdict, its mtime); None for what cannot be read or is not a JSON object. Only a regular file
    is read: opened without following a link or blocking, so a FIFO or device at the path never hangs
    the probe and a link never points it elsewhere."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None, None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, None
        mtime = info.st_mtime
        data = os.read(fd, MAX_VERDICT_BYTES + 1)
    except OSError:
        return None, None
    finally:
        os.close(fd)
    if len(data) > MAX_VERDICT_BYTES:
        return None, mtime
    try:
        verdict = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None, mtime
    return (verdict if isinstance(verdict, dict) else None), mtime


def process_start_time(
    pid: int = 1, proc_root: str = "/proc", clock_ticks: int | None = None
) -> float | None:
    """When process `pid` started, in Unix seconds: field 22 of /proc/PID/stat (clock ticks since boot)
    plus /proc/stat's `btime`. None when /proc does not say. PID 1 is the container's first process:
    it is new after every container restart."""
    try:
        with open(os.path.join(proc_root, str(pid), "stat"), "rb") as handle:
            stat = handle.read()
        # Field 2 (the command name, in parentheses) may hold spaces and parentheses: count after its end.
        fields = stat[stat.rindex(b")") + 1 :].split()
        start_ticks = int(fields[22 - 3])
        with open(os.path.join(proc_root, "stat"), encoding="ascii", errors="replace") as handle:
            btime = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
        ticks = clock_ticks if clock_ticks is not None else os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return btime + start_ticks / ticks


def capped(
    mode: Mode,
    decision: Decision,
    ledger_dir: str,
    start: float,
    now: float,
    max_restarts: int,
    window_s: float,
) -> Decision:
    """The decision under the corruption-restart cap (`pod_restarts`): liveness about to fail on the canary's
    verdict counts the restart, or holds it past the cap; readiness fails for a process the cap held."""
    try:
        from deploykit.render import pod_restarts
    except ImportError as exc:  # a wheel without it: no cap, as before the cap existed (never a crash)
        return Decision(decision.passed, _one_line(f"{decision.reason} (no restart cap: {exc})"))
    try:
        if mode == "live" and decision.verdict_failed:
            restart, why = pod_restarts.restart_or_hold(ledger_dir, start, now, max_restarts, window_s)
            if not restart:
                return Decision(True, _one_line(f"{decision.reason}; but {why}"))
            return Decision(False, _one_line(f"{decision.reason} ({why})"), verdict_failed=True)
        if mode == "ready":
            held = pod_restarts.capped_reason(ledger_dir, start, now, window_s, max_restarts)
            if held is not None:
                return Decision(False, _one_line(f"{held}; {decision.reason}"))
    except OSError as exc:
        if mode == "live" and decision.verdict_failed:
            # Fail closed: without the ledger the cap cannot hold, so no uncounted restart (readiness
            # still fails on the same verdict).
            return Decision(
                True,
                _one_line(
                    f"{decision.reason}; but the restart ledger in {ledger_dir} cannot be used "
                    f"({exc.strerror or exc}): vLLM is not restarted uncounted, it stays out of the Service"
                ),
            )
    return decision


def main(argv: list[str] | None = None, clock: Callable[[], float] = time.time) -> int:
    parser = argparse.ArgumentParser(
        prog="python3 -m deploykit.render.pod_probe",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("mode", choices=("live", "ready"), help="vLLM's liveness or readiness")
    parser.add_argument(
        "--health-url", required=True, help="vLLM's /health, e.g. http://127.0.0.1:8000/health"
    )
    parser.add_argument(
        "--verdict-file", required=True, help="the file `deploykit canary --verdict-file` writes"
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds for /health (default: %(default)s)"
    )
    parser.add_argument(
        "--max-verdict-age",
        type=float,
        default=DEFAULT_MAX_VERDICT_AGE_S,
        help="a verdict not rewritten for longer is ignored (default: %(default)s)",
    )
    parser.add_argument(
        "--pid", type=int, default=1, help="the process whose restart makes a verdict stale (default: 1)"
    )
    parser.add_argument("--proc-root", default="/proc", help="where /proc is (default: %(default)s)")
    parser.add_argument(
        "--ledger-dir",
        help="a directory that outlives the vLLM container (the pod's emptyDir): corruption restarts are "
        "counted there and capped (deploykit.render.pod_restarts); without it, no cap",
    )
    parser.add_argument("--max-restarts", type=int, default=3, help="per window (default: %(default)s)")
    parser.add_argument("--window-s", type=float, default=3600.0, help="the window (default: %(default)s)")
    args = parser.parse_args(argv)
    mode: Mode = args.mode
    healthy, detail = check_health(args.health_url, args.timeout)
    verdict, mtime = read_verdict(args.verdict_file) if healthy else (None, None)
    start = process_start_time(args.pid, args.proc_root) if verdict is not None else None
    now = clock()
    decision = decide(
        mode,
        health_ok=healthy,
        verdict=verdict,
        verdict_mtime=mtime,
        process_start=start,
        now=now,
        max_verdict_age_s=args.max_verdict_age,
        health_detail=detail,
    )
    if args.ledger_dir and start is not None:
        decision = capped(mode, decision, args.ledger_dir, start, now, args.max_restarts, args.window_s)
    print(f"{mode}: {'pass' if decision.passed else 'FAIL'}: {decision.reason}", flush=True)
    return exit_codes.OK if decision.passed else exit_codes.FAILED


if __name__ == "__main__":
    sys.exit(main())
