"""`deploykit canary`: the canary, its listener and its lines, until SIGINT/SIGTERM (or, with
`--exit-on-corruption`, the first wrong answer: exit `exit_codes.CORRUPT`, or a hung engine: exit
`exit_codes.HUNG`; the rendered systemd unit restarts the server on either). However it ends (a signal, a
crash), its last verdict is never `healthy`.

Errors are CanaryErrors (the profile's own ProfileError included): the CLI's one handler prints them, on
stderr, as one `deploykit: ...` line with exit code 2.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

from deploykit import exit_codes
from deploykit.canary.config import CanaryOptions, build_config
from deploykit.canary.runner import Canary, CanaryConfig, LiveNanSummary, RunSummary
from deploykit.canary.runtime import CanaryRuntime
from deploykit.errors import DeploykitError

__all__ = ["CanaryConfig", "CanaryOptions", "run_canary"]


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_canary(
    options: CanaryOptions, say: Callable[[str], None] = print, warn: Callable[[str], None] = _to_stderr
) -> int:
    """Run until SIGINT/SIGTERM; returns the exit code. Progress goes to `say`, warnings to `warn`. Raises
    CanaryError before the first run for options, a profile or a listen address that cannot be used, and
    at the first run when the URL is not the vLLM server it should be."""
    import signal

    from deploykit.untrusted_text import terminal_text

    # Every line quotes the server (its model id, its error messages): one line each, shown escaped.
    say_line, warn_line = say, warn
    say, warn = (lambda line: say_line(terminal_text(line))), (lambda line: warn_line(terminal_text(line)))
    host, _ = options.settings.listen_address  # (checked when the settings were made)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)
        stop.set()

    held = take_verdict_file(options.verdict_file, warn) if options.verdict_file is not None else None
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run(options, host, stop, received, say, warn)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held is not None:
            os.close(held)


def take_verdict_file(path: str, warn: Callable[[str], None]) -> int | None:
    """The verdict file taken for this canary's life (deploykit.canary.verdict): a second canary on it is
    refused (CanaryError, exit 2) instead of overwriting the first's verdicts. A lock that cannot be made
    (the directory is not there yet, not writable) is one warning: like the verdict's own write failures, it
    never ends the checking (and the verdict cannot be written there either)."""
    from deploykit.canary import verdict
    from deploykit.errors import CanaryError

    try:
        return verdict.hold_verdict_file(path)
    except verdict.VerdictFileHeld as held:
        who = f"another canary (pid {held.holder})" if held.holder is not None else "another canary"
        raise CanaryError(
            f"--verdict-file {path}: {who} is writing it, and one canary writes a verdict file: stop that "
            "one, or give this one its own --verdict-file"
        ) from None
    except OSError as exc:
        warn(
            f"deploykit canary: the verdict file {path} could not be locked for this canary "
            f"({exc.strerror or exc}); the canary goes on"
        )
        return None


def _run(
    options: CanaryOptions,
    host: str,
    stop: threading.Event,
    received: list[int],
    say: Callable[[str], None],
    warn: Callable[[str], None],
) -> int:
    import signal

    config = build_config(options) if not options.keep_running else wait_for_config(options, stop, warn)
    if config is None:
        return exit_codes.OK  # stopped before the canary could be set up

    def on_run(summary: RunSummary) -> None:
        word = {"pass": "ok  ", "wrong": "WRONG", "miss": "miss", "misconfigured": "MISCONFIGURED"}[
            summary.outcome
        ]
        line = f"run {summary.number + 1} {summary.case}: {word} {summary.report.elapsed_s:.2f} s"
        if summary.outcome != "pass":
            line += f"  {summary.report.diagnosis}"
        say(line)
        if summary.changed is not None:
            healthy, text = canary.health()
            say(f"state: {text} (/healthz {200 if healthy else 503})")
        if summary.outcome == "misconfigured":
            warn(
                f"deploykit canary: MISCONFIGURED: {summary.report.diagnosis} (the canary's setup and the "
                "server disagree; vLLM is left alone: this is no reason to restart it)"
            )
        if summary.stored:
            say(f"row stored in {summary.stored}")
        if options.exit_on_corruption and summary.outcome == "wrong":
            corrupt.set()
            stop.set()

    def on_live_nan(summary: LiveNanSummary) -> None:
        say(
            f"live traffic: WRONG: vLLM counted {summary.grown:g} more request(s) with NaN logits "
            f"(vllm:corrupted_requests_total {summary.total:g})"
        )
        if summary.changed is not None:
            healthy, text = canary.health()
            say(f"state: {text} (/healthz {200 if healthy else 503})")
        if summary.stored:
            say(f"row stored in {summary.stored}")
        if options.exit_on_corruption:
            corrupt.set()
            stop.set()

    def on_hung(diagnosis: str) -> None:
        say(f"HUNG: {diagnosis}")
        healthy, text = canary.health()
        say(f"state: {text} (/healthz {200 if healthy else 503})")
        if options.exit_on_corruption:
            hung.set()
            stop.set()

    corrupt = threading.Event()
    hung = threading.Event()
    canary = Canary(
        config,
        on_run=on_run,
        on_warning=lambda m: warn(f"deploykit canary: {m}"),
        on_live_nan=on_live_nan,
        on_hung=on_hung,
    )
    try:
        if not options.keep_running:  # (with it, the runs look, and say `misconfigured` until it is right)
            canary.look_at_server()  # a URL that is not the vLLM server it should be: refused before any line
    except BaseException as exc:
        canary.final_verdict(f"the canary could not start: {type(exc).__name__}: {exc}"[:400])
        raise
    runtime = CanaryRuntime(canary, watch_restarts=options.watch_restarts, stop=stop)
    bound = runtime.open_listener()
    rotation = ", ".join(canary.labels)
    endpoint = config.endpoint
    say(
        f"canary for {config.served_name} at {endpoint.shown}: every {config.settings.every_s:g} s, "
        f"rotation {rotation}; /healthz, /livez and /metrics on http://{host}:{bound}"
        + (
            f"; vLLM's NaN counter read every {config.settings.metrics_every_s:g} s"
            if config.settings.metrics_every_s > 0
            else ""
        )
        + (f"; verdict written to {config.verdict_file}" if config.verdict_file else "")
    )
    runtime.start(runs=False)  # the readers; the runs go on in this thread
    try:
        runtime.run_here()
    except BaseException as exc:
        canary.final_verdict(f"the canary crashed: {type(exc).__name__}: {exc}"[:400])
        raise
    finally:
        runtime.close()
    ended = f"{signal.Signals(received[0]).name} received" if received else "the canary ended"
    canary.final_verdict(f"the canary stopped ({ended}): nothing judges the server now")
    if hung.is_set():
        say(f"canary stopped: the engine is hung (exit {exit_codes.HUNG}, --exit-on-corruption)")
        return exit_codes.HUNG
    if corrupt.is_set():
        say(f"canary stopped: the output is corrupt (exit {exit_codes.CORRUPT}, --exit-on-corruption)")
        return exit_codes.CORRUPT
    say("canary stopped")
    return exit_codes.OK


def wait_for_config(
    options: CanaryOptions, stop: threading.Event, warn: Callable[[str], None]
) -> CanaryConfig | None:
    """`build_config`, tried again every `--every` seconds while it raises (a profile that cannot be read, a
    key that is not there yet, a server that is not vLLM): the verdict file says `misconfigured` and why,
    one warning line per new reason, and the canary never exits on it. None: stopped first."""
    import os
    import time
    import uuid

    from deploykit.canary.config import check_options
    from deploykit.canary.verdict import write_or_warn

    check_options(options)  # options no canary can run with are still refused at once
    run_id, sequence, said, file_error = uuid.uuid4().hex, 0, None, None
    while not stop.is_set():
        try:
            return build_config(options)
        except Exception as exc:
            what = str(exc) if isinstance(exc, DeploykitError) else f"{type(exc).__name__}: {exc}"
            why = f"the canary cannot be set up: {what}; it tries again every {options.settings.every_s:g} s"
        if why != said:
            warn(f"deploykit canary: MISCONFIGURED: {why} (vLLM is left alone: no reason to restart it)")
            said = why
        if options.verdict_file is not None:
            sequence += 1
            verdict = {"status": "misconfigured", "diagnosis": why, "written_at": time.time()}
            verdict |= {"pid": os.getpid(), "run_id": run_id, "sequence": sequence, "runs": 0, "final": False}
            file_error = write_or_warn(options.verdict_file, verdict, file_error, warn)
        stop.wait(options.settings.every_s)
    return None
