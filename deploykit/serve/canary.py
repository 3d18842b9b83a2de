"""`deploykit canary`: keep checking a running server's output, because some corruption comes later.

Every `every_s` seconds the canary sends the next smoke case of a cheap rotation (completion, chat, repeat,
long_then_short, prefix_cache, batch, ...) and judges the answers with the smoke rules. It serves:

- `GET /healthz`: 200 while the output is right; 503 once it is wrong (NaN/inf, token 0 or specials, an
  answer that changed at a clear margin). Slowness is not wrongness: timeouts, refused connections and
  HTTP 5xx/429 turn it 503 only after `miss_limit` consecutive misses (a busy server is not a broken one).
  After a wrong answer it turns 200 again only once a whole rotation has passed in a row.
- `GET /metrics`: Prometheus text (`deploykit_canary_*`).

With a verdict file (`--verdict-file`), it also writes its state there as JSON after every evaluation
(at start, after every run, on a server restart), atomically: the pod's exec probes
(`deploykit.render.pod_probe`) read it from a shared volume instead of depending on the canary's port.

It stores one row when its state changes (the first verdict included) and an hourly heartbeat, never a
row per run. `CanaryState` is the pure state machine; `Canary` adds the requests, metrics and rows;
`serve_http()` is the standard-library listener.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile, SmokeCase
    from deploykit.smoke import SmokeReport, SmokeRequest
    from deploykit.store import ResultRecord

DEFAULT_EVERY_S = 60.0
DEFAULT_MISS_LIMIT = 5
DEFAULT_HEARTBEAT_S = 3600.0
DEFAULT_LISTEN = "127.0.0.1:9400"
# `--exit-on-corruption`: the exit code that means "the output is wrong" (systemd restarts the server on it).
EXIT_CORRUPT = 3
RESTART_POLL_S = 2.0
LIVEZ_HEALTH_TIMEOUT_S = 5.0
# The canary's own requests are short: it runs forever, next to user traffic.
CANARY_MAX_TOKENS = 8
CANARY_BATCH_SIZE = 4

Status = Literal["starting", "healthy", "corrupt", "unreachable"]
Outcome = Literal["pass", "wrong", "miss"]


def outcome_of(report: SmokeReport) -> Outcome:
    """Wrong beats miss: one wrong answer is corruption even when another request timed out."""
    if any(not case.passed and not case.miss for case in report.cases) or not report.cases:
        return "wrong"
    if any(not case.passed for case in report.cases):
        return "miss"
    return "pass"


@dataclass
class CanaryState:
    """What the canary believes about the server, from the runs so far (pure: no clock, no I/O)."""

    rotation_len: int = 1
    miss_limit: int = DEFAULT_MISS_LIMIT
    status: Status = "starting"
    consecutive_misses: int = 0
    passes_since_wrong: int = 0
    diagnosis: str = "no run yet"

    @property
    def healthy(self) -> bool:
        return self.status in ("starting", "healthy")

    @property
    def corrupt(self) -> bool:
        return self.status == "corrupt"

    def restarted(self) -> Status | None:
        """The server came back after not answering /health: the verdict was about the process that is
        gone, so start afresh (`starting`) when it was bad; returns the new status when it changed."""
        if self.status not in ("corrupt", "unreachable"):
            return None
        self.status, self.consecutive_misses, self.passes_since_wrong = "starting", 0, 0
        self.diagnosis = "the server restarted (its /health went away and came back); no run since"
        return self.status

    def observe(self, case: str, outcome: Outcome, diagnosis: str) -> Status | None:
        """Take one run's outcome; returns the new status when it changed."""
        before = self.status
        if outcome == "wrong":
            self.status, self.passes_since_wrong, self.consecutive_misses = "corrupt", 0, 0
            self.diagnosis = f"{case}: {diagnosis}"
        elif outcome == "miss":
            self.consecutive_misses += 1
            if self.status != "corrupt" and self.consecutive_misses >= self.miss_limit:
                self.status = "unreachable"
                self.diagnosis = (
                    f"{self.consecutive_misses} runs in a row got no answer; last: {case}: {diagnosis}"
                )
        else:
            self.consecutive_misses = 0
            if self.status == "corrupt":
                self.passes_since_wrong += 1
                if self.passes_since_wrong >= self.rotation_len:
                    self.status = "healthy"
            else:
                self.status = "healthy"
            if self.status == "healthy":
                self.diagnosis = f"{case}: {diagnosis}"
        return self.status if self.status != before else None


def rotation_for(profile: Profile | None) -> list[SmokeCase]:
    """The profile's smoke cases plus every consistency kind, each cheap (few tokens, a small batch)."""
    from deploykit.profile.schema import CONSISTENCY_KINDS, SmokeCase
    from deploykit.smoke import derive_cases

    # Without a profile: only what any completions model can answer.
    base = derive_cases(profile) if profile is not None else [SmokeCase(kind="completion")]
    kinds = {case.kind for case in base}
    base += [SmokeCase(kind=kind) for kind in CONSISTENCY_KINDS if kind not in kinds]
    cheap = []
    for case in base:
        update: dict[str, Any] = {"max_tokens": min(case.max_tokens, CANARY_MAX_TOKENS)}
        if case.kind == "batch":
            update["batch_size"] = min(case.batch_size, CANARY_BATCH_SIZE)
        cheap.append(case.model_copy(update=update))
    return cheap


def case_labels(cases: Sequence[SmokeCase]) -> list[str]:
    seen: dict[str, int] = {}
    labels = []
    for case in cases:
        seen[case.kind] = seen.get(case.kind, 0) + 1
        labels.append(case.kind if seen[case.kind] == 1 else f"{case.kind}#{seen[case.kind]}")
    return labels


# --- metrics ----------------------------------------------------------------------------------------


class CanaryMetrics:
    """The canary's Prometheus series, in their own registry (several canaries can live in one process)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.registry = CollectorRegistry()
        self.healthy = Gauge(
            "deploykit_canary_healthy",
            "1 while the served output is right, 0 once it is not",
            registry=self.registry,
        )
        self.last_pass = Gauge(
            "deploykit_canary_last_pass_timestamp_seconds",
            "Unix time of the last run whose answers were all right",
            registry=self.registry,
        )
        self.last_run = Gauge(
            "deploykit_canary_last_run_timestamp_seconds", "Unix time of the last run", registry=self.registry
        )
        self.duration = Gauge(
            "deploykit_canary_last_run_duration_seconds", "How long the last run took", registry=self.registry
        )
        self.misses = Gauge(
            "deploykit_canary_consecutive_misses",
            "Runs in a row that got no answer in time (timeouts, refused, HTTP 5xx/429)",
            registry=self.registry,
        )
        self.runs = Counter("deploykit_canary_runs", "Canary runs, by case", ["case"], registry=self.registry)
        self.failures = Counter(
            "deploykit_canary_failures",
            "Failed canary runs, by case and reason (wrong: corrupt output; miss: no answer in time)",
            ["case", "reason"],
            registry=self.registry,
        )
        self.warnings = Counter(
            "deploykit_canary_warnings",
            "Runs with a near-tie divergence, by case",
            ["case"],
            registry=self.registry,
        )
        self.requests = Counter(
            "deploykit_canary_requests", "Requests the canary sent", registry=self.registry
        )
        self.generated = Counter(
            "deploykit_canary_generated_tokens",
            "Tokens the canary made the server generate",
            registry=self.registry,
        )
        self.prompt = Counter(
            "deploykit_canary_prompt_tokens", "Prompt tokens the canary sent", registry=self.registry
        )
        self.healthy.set(1)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return bytes(generate_latest(self.registry))


# --- the canary -------------------------------------------------------------------------------------

Runner = Callable[..., "SmokeReport"]


@dataclass
class CanaryConfig:
    url: str
    served_name: str
    cases: list[SmokeCase]
    every_s: float = DEFAULT_EVERY_S
    timeout_s: float = 120.0
    api_key: str | None = None
    special_ids: frozenset[int] = frozenset()
    max_model_len: int | None = None
    tie_tolerance: float = 0.05
    logprob_tolerance: float = 0.05
    miss_limit: int = DEFAULT_MISS_LIMIT
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    store_url: str | None = None
    store: bool = True
    profile_name: str | None = None
    profile_id: str | None = None
    adapter: str | None = None
    verdict_file: str | None = None


@dataclass
class RunSummary:
    number: int
    case: str
    outcome: Outcome
    report: SmokeReport
    changed: Status | None
    stored: str | None = None


@dataclass
class Canary:
    config: CanaryConfig
    clock: Callable[[], float] = time.time
    runner: Runner | None = None
    on_run: Callable[[RunSummary], None] | None = None
    on_warning: Callable[[str], None] | None = None
    metrics: CanaryMetrics = field(default_factory=CanaryMetrics)
    state: CanaryState = field(init=False)
    runs: int = 0
    last_row_at: float | None = None
    rows: list[ResultRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # Serialises verdict writes (the run loop and the restart watcher): a snapshot taken earlier never
    # replaces a later one.
    _verdict_lock: threading.Lock = field(default_factory=threading.Lock)
    _verdict_error: str | None = None

    def __post_init__(self) -> None:
        self.labels = case_labels(self.config.cases)
        self.state = CanaryState(rotation_len=len(self.config.cases), miss_limit=self.config.miss_limit)

    def requests_for_run(self, number: int) -> tuple[str, list[SmokeRequest]]:
        """Run `number` (from 0) checks the rotation's next case; its long prompts are salted by `number`."""
        from deploykit.smoke import smoke_requests

        index = number % len(self.config.cases)
        requests = smoke_requests(
            [self.config.cases[index]],
            self.config.served_name,
            self.config.adapter,
            max_model_len=self.config.max_model_len,
            salt=number * 7 + 1,
        )
        return self.labels[index], requests

    def run_once(self) -> RunSummary:
        from deploykit.smoke import run_smoke

        number = self.runs
        self.runs += 1
        label, requests = self.requests_for_run(number)
        runner = self.runner or run_smoke
        started = time.monotonic()
        report = runner(
            self.config.url,
            requests,
            timeout_s=self.config.timeout_s,
            api_key=self.config.api_key,
            special_ids=self.config.special_ids,
            tie_tolerance=self.config.tie_tolerance,
            logprob_tolerance=self.config.logprob_tolerance,
        )
        outcome = outcome_of(report)
        now = self.clock()
        with self._lock:
            changed = self.state.observe(label, outcome, report.diagnosis)
            self._count(label, outcome, report, now, time.monotonic() - started)
        summary = RunSummary(number, label, outcome, report, changed)
        if changed is not None:
            summary.stored = self._store_row(f"state:{changed}", report, now)
        elif self.last_row_at is not None and now - self.last_row_at >= self.config.heartbeat_s:
            summary.stored = self._store_row("heartbeat", report, now)
        self.write_verdict()
        if self.on_run is not None:
            self.on_run(summary)
        return summary

    def _count(self, label: str, outcome: Outcome, report: SmokeReport, now: float, took: float) -> None:
        m = self.metrics
        m.runs.labels(case=label).inc()
        if outcome != "pass":
            m.failures.labels(case=label, reason=outcome).inc()
        else:
            m.last_pass.set(now)
        if any(case.warning for case in report.cases):
            m.warnings.labels(case=label).inc()
        m.requests.inc(len(report.cases))
        m.generated.inc(sum(case.completion_tokens for case in report.cases))
        m.prompt.inc(sum(case.prompt_tokens or 0 for case in report.cases))
        m.last_run.set(now)
        m.duration.set(took)
        m.misses.set(self.state.consecutive_misses)
        m.healthy.set(1 if self.state.healthy else 0)

    def liveness(self) -> tuple[bool, str]:
        """`/livez`: wrong only on corruption, or when the server's own /health does not answer (what a
        liveness probe on /health said before). Misses and slowness never make it fail."""
        with self._lock:
            state = self.state
            if state.corrupt:
                return False, f"{state.status}: {state.diagnosis}"
            text = f"{state.status}: {state.diagnosis}"
        if not server_health_ok(self.config.url, LIVEZ_HEALTH_TIMEOUT_S):
            return False, f"the server's /health at {self.config.url} does not answer 200"
        return True, text

    def server_restarted(self) -> Status | None:
        """Called when the server's /health came back after going away (see `watch_restarts`)."""
        from deploykit.smoke import SmokeReport

        now = self.clock()
        with self._lock:
            changed = self.state.restarted()
            if changed is not None:
                self.metrics.healthy.set(1)
                self.metrics.misses.set(0)
        if changed is not None:
            self._store_row(
                f"state:{changed}", SmokeReport(passed=True, diagnosis="restarted", cases=[]), now
            )
        self.write_verdict()
        return changed

    def watch_restarts(self, stop: threading.Event, poll_s: float = RESTART_POLL_S) -> None:
        """Poll the server's /health; when it comes back after going away, `server_restarted()`."""
        was_up: bool | None = None
        while not stop.is_set():
            up = server_health_ok(self.config.url, min(poll_s, 5.0))
            if up and was_up is False:
                changed = self.server_restarted()
                if changed is not None:
                    self._warn("the server restarted: the canary starts afresh")
            was_up = up
            stop.wait(poll_s)

    def health(self) -> tuple[bool, str]:
        with self._lock:
            state = self.state
            return state.healthy, f"{state.status}: {state.diagnosis}"

    def _store_row(self, stage: str, report: SmokeReport, now: float) -> str | None:
        from datetime import UTC, datetime

        from deploykit.store import ResultRecord, StoreError, open_store

        self.last_row_at = now
        state = self.state
        record = ResultRecord(
            created_at=datetime.fromtimestamp(now, UTC),
            command="canary",
            profile_name=self.config.profile_name,
            profile_id=self.config.profile_id,
            verdict="pass" if state.healthy else "fail",
            stage=stage,
            diagnosis=f"{state.status}: {state.diagnosis}",
            base_url=self.config.url,
            versions={"deploykit": _version()},
            timings={
                "runs": float(self.runs),
                "every_s": self.config.every_s,
                "consecutive_misses": float(state.consecutive_misses),
                "run_s": round(report.elapsed_s, 4),
            },
            cases=report.cases,
        )
        self.rows.append(record)
        if not self.config.store:
            return None
        try:
            store = open_store(self.config.store_url)
        except StoreError as exc:
            self._warn(f"the canary row could not be stored: {exc}")
            return None
        try:
            store.add(record)
            return store.display_url
        except Exception as exc:  # a store outage must not stop the checking
            self._warn(f"the canary row could not be stored: {exc}")
            return None
        finally:
            store.close()

    def verdict(self) -> dict[str, Any]:
        """What the verdict file says: the state now, when, and which canary process said it."""
        with self._lock:
            status, diagnosis = self.state.status, self.state.diagnosis
        return {"status": status, "diagnosis": diagnosis, "written_at": self.clock(), "pid": os.getpid()}

    def write_verdict(self) -> None:
        """Write `verdict()` to the verdict file, if there is one. Rewritten after every run, changed or
        not, so that its mtime says the canary is alive. A failure is a warning (once per streak of
        failures), never the end of the checking."""
        path = self.config.verdict_file
        if path is None:
            return
        with self._verdict_lock:
            try:
                write_verdict_file(path, self.verdict())
            except OSError as exc:
                # Without the file names: the temporary file's name changes from one try to the next.
                error = f"{type(exc).__name__}: {exc.strerror or exc}"
                if error != self._verdict_error:
                    self._warn(f"the verdict file {path} could not be written ({error}); the canary goes on")
                self._verdict_error = error
                return
            if self._verdict_error is not None:
                self._warn(f"the verdict file {path} is written again")
                self._verdict_error = None

    def _warn(self, message: str) -> None:
        if self.on_warning is not None:
            self.on_warning(message)

    def run_forever(self, stop: threading.Event) -> None:
        """A run every `every_s` seconds (measured start to start; a slow run is followed at once). The
        verdict file says `starting` before the first run."""
        self.write_verdict()
        next_at = time.monotonic()
        while not stop.is_set():
            self.run_once()
            next_at = max(next_at + self.config.every_s, time.monotonic())
            stop.wait(max(0.0, next_at - time.monotonic()))


def write_verdict_file(path: str | os.PathLike[str], verdict: dict[str, Any]) -> None:
    """Atomically: a temporary file in the same directory (same filesystem), fsynced, then renamed over
    `path`; a reader sees the old verdict or the new one, never half of one. Mode 0644: the probes run in
    the vLLM container, often under another user. Raises OSError; the temporary file never stays."""
    target = os.fspath(path)
    directory, name = os.path.split(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(verdict) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def server_health_ok(url: str, timeout_s: float) -> bool:
    """vLLM's own `/health` answers 200 (it needs no API key)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _version() -> str:
    from deploykit import __version__

    return __version__


# --- the listener -----------------------------------------------------------------------------------


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {value!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve_http(canary: Canary, host: str, port: int) -> ThreadingHTTPServer:
    """`/healthz` and `/metrics` on a daemon thread; `.shutdown()` stops it. Port 0 picks a free port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                healthy, text = canary.health()
                self._answer(200 if healthy else 503, text.encode() + b"\n", "text/plain; charset=utf-8")
            elif path == "/livez":
                alive, text = canary.liveness()
                self._answer(200 if alive else 503, text.encode() + b"\n", "text/plain; charset=utf-8")
            elif path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                self._answer(200, canary.metrics.text(), CONTENT_TYPE_LATEST)
            else:
                self._answer(
                    404, b"not found: try /healthz, /livez or /metrics\n", "text/plain; charset=utf-8"
                )

        def _answer(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # probes every few seconds: keep quiet
            return

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="deploykit-canary-http", daemon=True).start()
    return server


# --- the command ------------------------------------------------------------------------------------


@dataclass
class CanaryOptions:
    url: str
    profile: str | None = None
    model: str | None = None
    every_s: float = DEFAULT_EVERY_S
    listen: str = DEFAULT_LISTEN
    store_url: str | None = None
    store: bool = True
    api_key_env: str | None = None
    timeout_s: float | None = None
    miss_limit: int = DEFAULT_MISS_LIMIT
    exit_on_corruption: bool = False
    watch_restarts: bool = True
    verdict_file: str | None = None


class CanaryError(Exception):
    pass


def build_config(options: CanaryOptions) -> CanaryConfig:
    """Cases, served name and limits from the profile, else from the server's own `/v1/models`."""
    import os

    profile = None
    profile_id = None
    if options.profile is not None:
        from deploykit.profile.load import load_profile
        from deploykit.profile.schema import ProfileError

        try:
            loaded = load_profile(options.profile)
        except ProfileError as exc:
            raise CanaryError(f"the profile cannot be used: {exc}") from None
        profile, profile_id = loaded.profile, loaded.id
    key_env = options.api_key_env or (profile.serve.api_key_env if profile else None)
    api_key = os.environ.get(key_env) if key_env else None
    if key_env and not api_key:
        raise CanaryError(f"the API key variable {key_env} is not set")
    if profile is not None:
        from deploykit.plan import resolve_model_path

        return config_for_profile(
            profile,
            profile_id,
            url=options.url,
            model_path=resolve_model_path(profile),
            every_s=options.every_s,
            api_key=api_key,
            served_name=options.model,
            timeout_s=options.timeout_s,
            miss_limit=options.miss_limit,
            store_url=options.store_url,
            store=options.store,
            verdict_file=options.verdict_file,
        )
    served, max_len = discover_model(options.url, api_key, options.model)
    return CanaryConfig(
        url=options.url,
        served_name=served,
        cases=rotation_for(None),
        every_s=options.every_s,
        timeout_s=options.timeout_s or 120.0,
        api_key=api_key,
        max_model_len=max_len,
        miss_limit=options.miss_limit,
        store_url=options.store_url,
        store=options.store,
        verdict_file=options.verdict_file,
    )


def config_for_profile(
    profile: Profile,
    profile_id: str | None,
    *,
    url: str,
    model_path: str | None,
    every_s: float = DEFAULT_EVERY_S,
    api_key: str | None = None,
    served_name: str | None = None,
    timeout_s: float | None = None,
    miss_limit: int = DEFAULT_MISS_LIMIT,
    store_url: str | None = None,
    store: bool = True,
    verdict_file: str | None = None,
) -> CanaryConfig:
    """The canary of a profile's server: its rotation, served name, limits and smoke tolerances."""
    from deploykit.smoke import special_token_ids

    adapters = list(profile.serve.lora.adapters)
    return CanaryConfig(
        url=url,
        served_name=served_name or profile.served_name,
        cases=rotation_for(profile),
        every_s=every_s,
        timeout_s=timeout_s or profile.smoke.timeout_s,
        api_key=api_key,
        special_ids=special_token_ids(model_path),
        max_model_len=profile.serve.max_model_len,
        tie_tolerance=profile.smoke.tie_tolerance,
        logprob_tolerance=profile.smoke.logprob_tolerance,
        miss_limit=miss_limit,
        store_url=store_url,
        store=store,
        profile_name=profile.name,
        profile_id=profile_id,
        adapter=adapters[0] if adapters else None,
        verdict_file=verdict_file,
    )


def discover_model(url: str, api_key: str | None, wanted: str | None) -> tuple[str, int | None]:
    """The served model (the first, or `wanted`) and its max_model_len, from vLLM's `/v1/models`."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=30)
        response.raise_for_status()
        models = response.json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        raise CanaryError(
            f"cannot list the served models at {url}/v1/models ({exc}); give --profile or --model"
        ) from None
    for model in models:
        if wanted is None or model.get("id") == wanted:
            length = model.get("max_model_len")
            return str(model["id"]), int(length) if isinstance(length, int) else None
    raise CanaryError(
        f"{url} does not serve {wanted!r}; it serves {', '.join(m.get('id', '?') for m in models)}"
    )


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_canary(
    options: CanaryOptions, say: Callable[[str], None] = print, warn: Callable[[str], None] = _to_stderr
) -> int:
    """Run until SIGINT/SIGTERM; returns the exit code. Progress goes to `say`, warnings to `warn`."""
    import signal

    try:
        host, port = parse_listen(options.listen)
        config = build_config(options)
    except (CanaryError, ValueError) as exc:
        say(f"deploykit canary: {exc}")
        return 2

    def on_run(summary: RunSummary) -> None:
        word = {"pass": "ok  ", "wrong": "WRONG", "miss": "miss"}[summary.outcome]
        line = f"run {summary.number + 1} {summary.case}: {word} {summary.report.elapsed_s:.2f} s"
        if summary.outcome != "pass":
            line += f"  {summary.report.diagnosis}"
        say(line)
        if summary.changed is not None:
            healthy, text = canary.health()
            say(f"state: {text} (/healthz {200 if healthy else 503})")
        if summary.stored:
            say(f"row stored in {summary.stored}")
        if options.exit_on_corruption and summary.outcome == "wrong":
            corrupt.set()
            stop.set()

    stop = threading.Event()
    corrupt = threading.Event()
    canary = Canary(config, on_run=on_run, on_warning=lambda m: warn(f"deploykit canary: {m}"))
    try:
        server = serve_http(canary, host, port)
    except OSError as exc:
        say(f"deploykit canary: cannot listen on {host}:{port}: {exc.strerror}")
        return 2
    bound = server.server_address[1]
    rotation = ", ".join(canary.labels)
    say(
        f"canary for {config.served_name} at {config.url}: every {config.every_s:g} s, rotation {rotation}; "
        f"/healthz, /livez and /metrics on http://{host}:{bound}"
        + (f"; verdict written to {config.verdict_file}" if config.verdict_file else "")
    )
    if options.watch_restarts:
        threading.Thread(
            target=canary.watch_restarts, args=(stop,), name="deploykit-canary-restarts", daemon=True
        ).start()
    previous = {
        sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        canary.run_forever(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.shutdown()
        server.server_close()
    if corrupt.is_set():
        say(f"canary stopped: the output is corrupt (exit {EXIT_CORRUPT}, --exit-on-corruption)")
        return EXIT_CORRUPT
    say("canary stopped")
    return 0
