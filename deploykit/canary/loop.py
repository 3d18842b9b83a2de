"""The canary's run loop: a run every `every_s` seconds, each on a thread of its own, so that a stop ends
the loop mid-request and a run stuck past its deadlines is abandoned instead of stopping the checking; and,
with `keep_running` (the chart's and the units' canary), a canary that never ends on its own trouble.

With `keep_running`, what the canary cannot do for a reason of its own — a key the server refuses, a served
name it does not serve, a URL that is not vLLM (discovery's CanaryError), a failure of its own code — is a
`misconfigured` verdict and one warning line, and the loop goes on: the next run looks again (and re-reads an
`api_key_file`). A canary that exits on them crash-loops beside a healthy vLLM (issue 34). Without it (a
person's `deploykit canary`), such an error ends the loop, as before.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from deploykit.errors import CanaryError

if TYPE_CHECKING:
    from deploykit.canary.runner import Canary

STOP_POLL_S = 0.2
"""How often the loop looks whether it should stop (or a run is stuck) while a run is in flight."""


def run_forever(canary: Canary, stop: threading.Event, keep_running: bool = False) -> None:
    """A run every `every_s` seconds (start to start; a slow run is followed at once). The verdict file
    says `starting` before the first run. A run's exception is raised here, unless `keep_running`."""
    canary.write_verdict()
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            canary.refresh_api_key()
            run_stoppable(canary, stop)
        except CanaryError as exc:
            if not keep_running:
                raise
            canary.misconfigured(f"{exc}; the canary looks again every {canary.config.settings.every_s:g} s")
        except Exception as exc:
            if not keep_running:
                raise
            canary.misconfigured(
                f"the canary's own run failed ({type(exc).__name__}: {exc}); it tries again every "
                f"{canary.config.settings.every_s:g} s"
            )
        next_at = max(next_at + canary.config.settings.every_s, time.monotonic())
        stop.wait(max(0.0, next_at - time.monotonic()))


def run_stoppable(canary: Canary, stop: threading.Event) -> None:
    """One run on its own thread: abandoned (its answers not judged) when `stop` is set, or when it is still
    going past its requests' deadlines plus `defaults.RUN_GRACE_S` (every request has a whole-request
    deadline, so such a run is stuck in the canary itself: a `misconfigured` verdict says so)."""
    cancel = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            canary.run_cancellable(cancel)
        except BaseException as exc:  # handed to the loop, which raises it
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"deploykit-canary-run-{canary.runs + 1}", daemon=True)
    thread.start()
    while thread.is_alive():
        if stop.is_set():
            cancel.set()
            return
        stuck = canary.stuck(run_only=True)  # (a run not registered yet is not a quiet canary)
        if stuck is not None:
            cancel.set()
            canary.abandon_run()
            canary.misconfigured(f"{stuck}: abandoned, the next run starts on time")
            return
        thread.join(STOP_POLL_S)
    if failure:
        raise failure[0]


def watch_restarts(canary: Canary, stop: threading.Event, poll_s: float) -> None:
    """Poll the server's /health; when it comes back after going away, `canary.server_restarted()`."""
    from deploykit.canary.discovery import server_health_ok

    was_up: bool | None = None
    while not stop.is_set():
        up = server_health_ok(canary.config.url, min(poll_s, 5.0))
        if up and was_up is False:
            changed = canary.server_restarted()
            if changed is not None:
                canary.warn("the server restarted: the canary starts afresh")
        was_up = up
        stop.wait(poll_s)
