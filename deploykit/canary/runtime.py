"""`CanaryRuntime`: the one owner of a canary's threads and their stop, for `deploykit canary` and for serve's
in-process canary alike.

Its threads: the runs (one every `every_s` seconds, each on a thread of its own, so that a stop ends the
loop mid-request and a run stuck past its deadlines is abandoned instead of stopping the checking), the
page reader (one read of the server's /metrics per tick, handed to the canary for its NaN counter and its
progress), the restart watcher (the server's /health going away and coming back starts the canary afresh)
and the HTTP listener (`/healthz`, `/livez`, `/metrics`). `start` starts them, `pause` stops all but the
listener (serve restarting vLLM), `close` stops everything.

With `keep_running` (the chart's and the units' canary), what the canary cannot do for a reason of its own —
a key the server refuses, a served name it does not serve, a URL that is not vLLM (discovery's CanaryError),
a failure of its own code — is a `misconfigured` verdict and one warning line, and the loop goes on: the
next run looks again (and re-reads an `api_key_file`). A canary that exits on them crash-loops beside a
healthy vLLM (issue 34). Without it (a person's `deploykit canary`), such an error ends the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from deploykit.canary import defaults
from deploykit.errors import CanaryError

if TYPE_CHECKING:
    from http.server import ThreadingHTTPServer

    from deploykit.canary.runner import Canary

STOP_POLL_S = 0.2
"""How often the loop looks whether it should stop (or a run is stuck) while a run is in flight."""
JOIN_GRACE_S = 5.0
"""How long `pause` waits for a reader beyond its own read deadline."""


class CanaryRuntime:
    """The threads of one canary and the event that stops them."""

    def __init__(
        self,
        canary: Canary,
        *,
        watch_restarts: bool = False,
        restart_poll_s: float = defaults.RESTART_POLL_S,
        on_loop_error: Callable[[BaseException], None] | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        from deploykit.canary.server_page import PageReader

        self.canary = canary
        self.watch_restarts = watch_restarts
        self.restart_poll_s = restart_poll_s
        self.on_loop_error = on_loop_error
        """Called with what ended a background run loop (None: the loop's error is only a warning)."""
        self.stop_event = stop or threading.Event()
        """Set by `stop`/`pause` (or by whoever passed it in: `deploykit canary`'s signal handlers)."""
        self.page_reader = PageReader()
        self._threads: list[threading.Thread] = []
        self._listener: ThreadingHTTPServer | None = None

    # --- the listener ---------------------------------------------------------------------------------

    def open_listener(self, flag: str = "--listen") -> int:
        """`/healthz`, `/livez` and `/metrics` on the settings' `listen` address; returns the bound port.
        Raises ListenAddressError (one line naming `flag`) when it cannot be bound."""
        from deploykit.canary.listener import listen

        self._listener = listen(self.canary, flag)
        return int(self._listener.server_address[1])

    # --- the threads ----------------------------------------------------------------------------------

    def start(self, runs: bool = True) -> None:
        """Start the readers (and, with `runs`, the run loop) on daemon threads; after a `pause`, with a
        fresh stop event."""
        if self.stop_event.is_set():
            self.stop_event = threading.Event()
        stop = self.stop_event
        if self.canary.config.reads_page:
            self._spawn(self._read_pages, stop, "deploykit-canary-page")
        if self.watch_restarts:
            self._spawn(self._watch_restarts, stop, "deploykit-canary-restarts")
        if runs:
            self._spawn(self._run_in_background, stop, "deploykit-canary-runs")

    def run_here(self) -> None:
        """The run loop in the calling thread, until `stop()` (or, without `keep_running`, its error)."""
        run_loop(self.canary, self.stop_event, keep_running=self.canary.config.keep_running)

    def stop(self) -> None:
        self.stop_event.set()

    def pause(self) -> None:
        """Stop the threads (a run in flight is abandoned, not judged; a read in flight ends within its
        deadline) and wait for them; the listener keeps answering."""
        self.stop_event.set()
        config = self.canary.config
        waits = {
            "deploykit-canary-runs": config.request_timeout_s * 4 + 30,
            "deploykit-canary-page": config.endpoint.metrics_deadline_s * 2 + JOIN_GRACE_S,
            "deploykit-canary-restarts": defaults.LIVEZ_HEALTH_TIMEOUT_S + JOIN_GRACE_S,
        }
        for thread in self._threads:
            thread.join(timeout=waits.get(thread.name, JOIN_GRACE_S))
        self._threads = []
        self.page_reader.forget()

    def close(self) -> None:
        """Stop everything, the listener too."""
        self.pause()
        if self._listener is not None:
            self._listener.shutdown()
            self._listener.server_close()
            self._listener = None

    def _spawn(self, target: Callable[[threading.Event], None], stop: threading.Event, name: str) -> None:
        thread = threading.Thread(target=target, args=(stop,), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run_in_background(self, stop: threading.Event) -> None:
        try:
            run_loop(self.canary, stop, keep_running=self.canary.config.keep_running)
        except Exception as exc:  # the canary must never take its host (serve's vLLM) down with it
            if self.on_loop_error is not None:
                self.on_loop_error(exc)
            else:
                self.canary.warn(f"the canary stopped: {type(exc).__name__}: {exc}")

    def _read_pages(self, stop: threading.Event) -> None:
        """A read of the server's /metrics every tick, for every reader; a failing read or callback never
        ends the reading."""
        from deploykit.canary.server_page import ServerPage

        every_s = self.canary.config.page_every_s
        while not stop.is_set():
            try:
                page = self.page_reader.read(self.canary.config.endpoint)
                if not stop.is_set():
                    self.canary.take_page(page)
            except Exception as exc:  # the reader must outlive any one bad read
                from deploykit.net import redact_text  # its text can carry the URL or a header value

                self.canary.warn(
                    f"reading the server's /metrics failed: {redact_text(f'{type(exc).__name__}: {exc}')}"
                )
                self.canary.take_page(ServerPage(problem="the read failed"))
            stop.wait(every_s)

    def _watch_restarts(self, stop: threading.Event) -> None:
        """Poll the server's /health; when it comes back after going away, the canary starts afresh —
        unless the server's /metrics tells its process start time (`Canary.take_page` sees a restart by
        that changing): then a /health that was only slow under load and came back is no restart."""
        from deploykit.canary.discovery import server_health_ok

        was_up: bool | None = None
        while not stop.is_set():
            up = server_health_ok(self.canary.config.endpoint, min(self.restart_poll_s, 5.0))
            if up and was_up is False and self.canary.server_start is None:
                self.page_reader.forget()
                if self.canary.server_restarted() is not None:
                    self.canary.warn("the server restarted: the canary starts afresh")
            was_up = up
            stop.wait(self.restart_poll_s)


def run_loop(canary: Canary, stop: threading.Event, keep_running: bool = False) -> None:
    """A run every `every_s` seconds (start to start; a slow run is followed at once). The verdict file
    says `starting` before the first run. A run's exception is raised here, unless `keep_running`."""
    canary.write_verdict()
    every_s = canary.config.settings.every_s
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            canary.refresh_api_key()
            run_stoppable(canary, stop)
        except CanaryError as exc:
            if not keep_running:
                raise
            canary.misconfigured(f"{exc}; the canary looks again every {every_s:g} s")
        except Exception as exc:
            if not keep_running:
                raise
            canary.misconfigured(
                f"the canary's own run failed ({type(exc).__name__}: {exc}); "
                f"it tries again every {every_s:g} s"
            )
        next_at = max(next_at + every_s, time.monotonic())
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
