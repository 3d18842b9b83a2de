"""`deploykit serve`: profile → probe → plan → a running vLLM → smoke verdict → one stored row.

Every attempt ends in exactly one row in the results store, including the ones that fail before the
server came up. vLLM runs in its own process group; deploykit forwards SIGINT/SIGTERM to the whole
group and waits until it is gone, so no vLLM process outlives the command.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from deploykit.fixes.base import FixMode

if TYPE_CHECKING:
    from deploykit.launch import ServerProcess
    from deploykit.plan import Plan
    from deploykit.profile import LoadedProfile
    from deploykit.smoke import CaseResult, SmokeReport
    from deploykit.store import ResultRecord

EXIT_PASS = 0
EXIT_FAIL = 1
REDACTED = "***"
# Names whose values are secrets even when no profile declares them (an inherited HF_TOKEN, say).
_SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL", re.I
)
_HF_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_MIN_SECRET_LEN = 6


class ServeOptions(BaseModel):
    """What the `serve` command was asked to do."""

    model_config = ConfigDict(extra="forbid")

    profile: str
    overrides: dict[str, FixMode] = Field(default_factory=dict)
    check: bool = False
    port: int | None = Field(default=None, ge=1, le=65535)
    store_url: str | None = None
    quiet: bool = False
    log_dir: Path | None = None


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class ServeFailure(Exception):
    """An attempt ended before a verdict; `stage` says where."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


# --- the terminal -----------------------------------------------------------------------------------


class ConsoleUI:
    """Progress for people: deploykit's lines on stdout, vLLM's log on stderr (unless quiet)."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console

        self.out = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self._status: Any = None
        self._last_plain = 0.0

    def say(self, message: str) -> None:
        self.out.print(message, markup=False)
        self.out.file.flush()

    def warn(self, message: str) -> None:
        self.err.print(f"deploykit: {message}", markup=False, style="yellow")

    def log_lines(self, lines: Sequence[str]) -> None:
        if not self.quiet:
            for line in lines:
                self.err.print(line, markup=False, highlight=False, soft_wrap=True)

    def progress(self, elapsed: float, last_line: str) -> None:
        text = f"starting vLLM: {elapsed:4.0f} s  {last_line[-100:]}"
        if self.err.is_terminal:
            if self._status is None:
                self._status = self.err.status(text)
                self._status.start()
            else:
                self._status.update(text)
        elif elapsed - self._last_plain >= 10:
            self._last_plain = elapsed
            self.err.print(text, markup=False)

    def end_progress(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def case(self, result: CaseResult) -> None:
        mark = "ok  " if result.passed else "FAIL"
        speed = f"{result.tokens_per_s:.1f} tok/s" if result.tokens_per_s else "-"
        line = (
            f"  {mark} {result.name:<12} {result.latency_s:6.2f} s  {speed:>12}  ids {result.first_ids[:8]}"
        )
        self.say(line + (f"\n       {result.diagnosis}" if result.diagnosis else ""))


class LogFollower:
    """Reads the lines a log file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        return [line.decode(errors="replace").rstrip("\r") for line in complete]


# --- pure helpers -----------------------------------------------------------------------------------


def with_port(argv: Sequence[str], port: int) -> list[str]:
    """The argv with its `--port` value replaced (or added)."""
    result = list(argv)
    if "--port" in result:
        result[result.index("--port") + 1] = str(port)
    else:
        result += ["--port", str(port)]
    return result


def argv_value(argv: Sequence[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else default


def client_host(bind_host: str) -> str:
    return "127.0.0.1" if bind_host in ("0.0.0.0", "::", "") else bind_host


def resolve_executable(argv: Sequence[str]) -> list[str]:
    """`vllm` → the one next to this Python (the venv deploykit runs in), when it is there."""
    result = list(argv)
    if result and result[0] == "vllm":
        beside = Path(sys.executable).parent / "vllm"
        if beside.exists():
            result[0] = str(beside)
    return result


def child_environment(plan: Plan, parent: Mapping[str, str]) -> dict[str, str]:
    """The launch env: the parent's, the plan's values, and each `${NAME}` reference resolved.

    Raises ServeFailure("secrets") naming every missing variable.
    """
    env = dict(parent)
    env.pop("DEPLOYKIT_FIXES", None)  # only the plan decides which fixes run
    missing = [f"{key} (from ${source})" for key, source in plan.secret_env.items() if not parent.get(source)]
    if missing:
        raise ServeFailure(
            "secrets",
            f"the profile takes these from the environment, but they are not set: {', '.join(missing)}",
        )
    for key, value in plan.env.items():
        source = plan.secret_env.get(key)
        env[key] = parent[source] if source is not None else value
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def secret_values(plan: Plan | None, parent: Mapping[str, str]) -> list[str]:
    """Every value that must never be printed or stored: referenced secrets and secret-named variables."""
    values = {parent[source] for source in (plan.secret_env.values() if plan else []) if parent.get(source)}
    values.update(value for name, value in parent.items() if _SECRET_NAME.search(name) and value)
    return sorted((v for v in values if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _HF_TOKEN_SHAPE.sub(REDACTED, text)


def plan_for_store(plan: Plan, argv: Sequence[str]) -> dict[str, Any]:
    """The plan as stored: the launched argv, env with secrets as references, fixes, warnings."""
    data = plan.model_dump(mode="json", exclude={"facts"})
    data["argv"] = list(argv)
    return data


def overhead(timings: Mapping[str, float | None]) -> float:
    """deploykit's own time: the total minus vLLM's start-up and stop, the model build and the requests."""
    spent_elsewhere = sum(
        timings.get(key) or 0.0 for key in ("model_build_s", "startup_s", "requests_s", "stop_s")
    )
    return max(0.0, (timings.get("total_s") or 0.0) - spent_elsewhere)


def exit_code_for(record: ResultRecord) -> int:
    if record.verdict == "interrupted":
        signum = int(record.timings.get("signal") or signal.SIGTERM)
        return 128 + signum
    return EXIT_PASS if record.passed else EXIT_FAIL


def default_log_dir() -> Path:
    from platformdirs import user_log_dir

    return Path(user_log_dir("deploykit"))


# --- signals ----------------------------------------------------------------------------------------


@dataclass
class SignalGate:
    """SIGINT/SIGTERM raise `Interrupted` while `armed`; otherwise they are only remembered."""

    armed: bool = True
    received: int | None = None
    previous: dict[int, Any] = field(default_factory=dict)

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self.armed:
            self.armed = False  # one interruption is enough: cleanup must not be interrupted again
            raise Interrupted(signum)


@contextmanager
def forwarded_signals() -> Iterator[SignalGate]:
    gate = SignalGate()
    for sig in (signal.SIGINT, signal.SIGTERM):
        gate.previous[int(sig)] = signal.signal(sig, gate.handler)
    try:
        yield gate
    finally:
        for signum, previous in gate.previous.items():
            signal.signal(signum, previous)


# --- the attempt ------------------------------------------------------------------------------------


@dataclass
class Attempt:
    """Everything known about one attempt so far; becomes the stored row."""

    options: ServeOptions
    started: float = field(default_factory=time.monotonic)
    stage: str = "profile"
    loaded: LoadedProfile | None = None
    plan: Plan | None = None
    argv: list[str] = field(default_factory=list)
    server: ServerProcess | None = None
    base_url: str | None = None
    report: SmokeReport | None = None
    timings: dict[str, float | None] = field(default_factory=dict)
    facts: dict[str, Any] | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    secrets: list[str] = field(default_factory=list)

    def mark(self, key: str, since: float) -> None:
        self.timings[key] = round(time.monotonic() - since, 4)


def run_serve(options: ServeOptions, ui: ConsoleUI | None = None) -> int:
    """One whole attempt; returns the process exit code. Stores exactly one row whatever happens."""
    ui = ui or ConsoleUI(options.quiet)
    attempt = Attempt(options=options)
    verdict, diagnosis = "error", ""
    with forwarded_signals() as gate:
        try:
            _prepare_and_launch(attempt, ui)
            report = _smoke(attempt, ui)
            verdict, diagnosis = ("pass" if report.passed else "fail"), report.diagnosis
            attempt.stage = "done"
        except Interrupted as exc:
            verdict = "interrupted"
            diagnosis = f"stopped by {signal.Signals(exc.signum).name} during {attempt.stage}"
            attempt.timings["signal"] = exc.signum
        except ServeFailure as exc:
            attempt.stage = exc.stage
            diagnosis = str(exc)
        except Exception as exc:  # an unexpected error still gets its row
            diagnosis = f"{type(exc).__name__}: {exc}"
        finally:
            gate.armed = False
            ui.end_progress()
        keep_serving = verdict == "pass" and not options.check and gate.received is None
        if attempt.server is not None and not keep_serving:
            _stop(attempt, ui)
        record = _record(attempt, verdict, diagnosis)
        result_id, where = _store(record, options.store_url, ui)
        _print_verdict(record, result_id, where, ui)
        if keep_serving and attempt.server is not None:
            return _serve_foreground(attempt, gate, ui)
        if gate.received is not None and verdict != "interrupted":
            return 128 + gate.received
        return exit_code_for(record)


def _prepare_and_launch(attempt: Attempt, ui: ConsoleUI) -> None:
    from deploykit.launch import LaunchError, port_in_use, start_server
    from deploykit.plan import make_plan
    from deploykit.probe import probe
    from deploykit.profile import ProfileError, load_profile

    options = attempt.options
    try:
        attempt.loaded = load_profile(options.profile)
    except ProfileError as exc:
        raise ServeFailure("profile", f"the profile cannot be used: {_issues(exc)}") from None
    profile = attempt.loaded.profile

    attempt.stage = "probe"
    facts = probe()
    attempt.facts = facts.model_dump(mode="json")
    attempt.versions = {
        "deploykit": _deploykit_version(),
        "vllm": facts.vllm_version,
        "torch": facts.torch_version,
    }

    attempt.stage = "plan"
    plan = make_plan(attempt.loaded, facts, options.overrides)
    attempt.plan = plan
    attempt.secrets = secret_values(plan, os.environ)
    argv = plan.argv if options.port is None else with_port(plan.argv, options.port)
    attempt.argv = argv
    if plan.errors:
        raise ServeFailure("plan", "the plan has errors: " + "; ".join(plan.errors))
    for warning in plan.warnings:
        ui.warn(warning)
    host = argv_value(argv, "--host", "127.0.0.1")
    port = int(argv_value(argv, "--port", "8000"))
    attempt.base_url = f"http://{client_host(host)}:{port}"

    attempt.stage = "port"
    if port_in_use(port, host if host not in ("0.0.0.0", "::") else "0.0.0.0"):
        raise ServeFailure(
            "port",
            f"port {port} on {host} is already in use; stop what listens there or pass --port N",
        )

    attempt.stage = "secrets"
    env = child_environment(plan, os.environ)

    attempt.stage = "model"
    build_started = time.monotonic()
    _ensure_model(plan, profile.model.source, ui)
    attempt.mark("model_build_s", build_started)

    attempt.stage = "launch"
    log_dir = options.log_dir or default_log_dir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = log_dir / f"{profile.name}-{stamp}-{os.getpid()}.log"
    launch_argv = resolve_executable(argv)
    attempt.timings["before_launch_s"] = round(time.monotonic() - attempt.started, 4)
    try:
        attempt.server = start_server(launch_argv, env, log_path=log_path, host=client_host(host), port=port)
    except LaunchError as exc:
        raise ServeFailure("launch", str(exc)) from None
    ui.say(f"vLLM started: pid {attempt.server.pid} (own process group), log {log_path}")
    _prewarm_imports()

    attempt.stage = "startup"
    follower = LogFollower(log_path)

    def on_progress(elapsed: float, last_line: str) -> None:
        ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
        ui.progress(elapsed, redact(last_line, attempt.secrets))

    try:
        startup = attempt.server.wait_healthy(profile.deploy.startup_timeout_s, on_progress, poll_s=0.2)
    except LaunchError as exc:
        ui.end_progress()
        ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
        if exc.exit_code is not None:
            message = f"vLLM exited during start-up with code {exc.exit_code}"
        else:
            message = (
                f"vLLM did not become healthy within {profile.deploy.startup_timeout_s} s (start-up timeout)"
            )
        raise ServeFailure("startup", f"{message}; last log lines:\n{_short_tail(exc.log_tail)}") from None
    ui.end_progress()
    ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
    attempt.timings["startup_s"] = round(startup, 4)
    ui.say(f"vLLM healthy after {startup:.1f} s at {attempt.base_url}")


def _prewarm_imports() -> None:
    """Import what the smoke and the store need while vLLM loads, so it is off the path to the verdict."""

    def work() -> None:
        import httpx  # noqa: F401

        import deploykit.smoke
        import deploykit.store  # noqa: F401

    threading.Thread(target=work, name="deploykit-prewarm", daemon=True).start()


def _issues(exc: Exception) -> str:
    return "; ".join(str(issue) for issue in getattr(exc, "issues", [])) or str(exc)


def _short_tail(tail: str, lines: int = 12) -> str:
    return "\n".join(tail.strip().splitlines()[-lines:])


def _ensure_model(plan: Plan, source: str, ui: ConsoleUI) -> None:
    """Build the builtin tiny model on first use (cached); a missing local path is vLLM's to report."""
    from deploykit.profile import BUILTIN_PREFIX

    if not source.startswith(BUILTIN_PREFIX) or (Path(plan.model_path) / "deploykit-recipe.json").exists():
        return
    from deploykit.tinymodel import build_tiny_model, default_cache_dir

    ui.say(f"building the tiny demo model locally (first use, cached in {default_cache_dir()}) ...")
    built = build_tiny_model()
    if str(built) != plan.model_path:
        raise ServeFailure(
            "model", f"the tiny model was built at {built}, but the plan expects {plan.model_path}"
        )


def _smoke(attempt: Attempt, ui: ConsoleUI) -> SmokeReport:
    from deploykit.smoke import derive_cases, run_smoke, smoke_requests, special_token_ids

    assert attempt.loaded is not None and attempt.plan is not None and attempt.base_url is not None
    profile = attempt.loaded.profile
    attempt.stage = "smoke"
    adapters = list(profile.serve.lora.adapters)
    requests = smoke_requests(derive_cases(profile), profile.served_name, adapters[0] if adapters else None)
    api_key = os.environ.get(profile.serve.api_key_env) if profile.serve.api_key_env else None
    ui.say(f"smoke: {len(requests)} request(s) against {attempt.base_url}")
    report = run_smoke(
        attempt.base_url,
        requests,
        timeout_s=profile.smoke.timeout_s,
        api_key=api_key,
        special_ids=special_token_ids(attempt.plan.model_path),
        on_case=ui.case,
    )
    attempt.report = report
    attempt.timings["smoke_s"] = round(report.elapsed_s, 4)
    attempt.timings["requests_s"] = round(sum(case.latency_s for case in report.cases), 4)
    for case in report.cases:
        attempt.timings[f"case_{case.name}_s"] = case.latency_s
    return report


def _stop(attempt: Attempt, ui: ConsoleUI) -> None:
    assert attempt.server is not None
    started = time.monotonic()
    code = attempt.server.stop()
    attempt.mark("stop_s", started)
    ui.log_lines([])
    ui.say(f"vLLM stopped (exit code {code}); its process group is gone")


def _record(attempt: Attempt, verdict: str, diagnosis: str) -> ResultRecord:
    from deploykit.store import ResultRecord

    attempt.mark("total_s", attempt.started)
    attempt.timings["overhead_s"] = round(overhead(attempt.timings), 4)
    # CPU this process used since it started (imports included, vLLM's processes not): load-proof overhead.
    attempt.timings["deploykit_cpu_s"] = round(time.process_time(), 4)
    loaded, plan = attempt.loaded, attempt.plan
    log_tail = attempt.server.log_tail(60) if attempt.server is not None else ""
    record = ResultRecord(
        command="serve",
        profile_name=loaded.profile.name if loaded else attempt.options.profile,
        profile_id=loaded.id if loaded else None,
        verdict=verdict,
        stage=attempt.stage,
        diagnosis=redact(diagnosis, attempt.secrets),
        base_url=attempt.base_url,
        facts=attempt.facts,
        plan=plan_for_store(plan, attempt.argv) if plan else None,
        versions=attempt.versions or {"deploykit": _deploykit_version()},
        timings=attempt.timings,
        cases=attempt.report.cases if attempt.report else [],
        log_path=str(attempt.server.log_path) if attempt.server else None,
        log_tail=redact(log_tail, attempt.secrets),
    )
    return record


def _store(record: ResultRecord, url: str | None, ui: ConsoleUI) -> tuple[int | None, str]:
    from deploykit.store import StoreError, display_url, open_store

    try:
        store = open_store(url)
    except StoreError as exc:
        ui.warn(f"the result could not be stored: {exc}")
        return None, display_url(url) if url else "(default store)"
    try:
        return store.add(record), store.display_url
    finally:
        store.close()


def _print_verdict(record: ResultRecord, result_id: int | None, where: str, ui: ConsoleUI) -> None:
    word = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "interrupted": "INTERRUPTED"}[record.verdict]
    ui.say(f"verdict: {word} ({record.stage}): {record.diagnosis}")
    if result_id is not None:
        ui.say(f"result #{result_id} stored in {where}")


def _serve_foreground(attempt: Attempt, gate: SignalGate, ui: ConsoleUI) -> int:
    """Keep serving until SIGINT/SIGTERM (forwarded to vLLM's whole group) or until vLLM exits."""
    assert attempt.server is not None and attempt.loaded is not None
    server = attempt.server
    follower = LogFollower(server.log_path)
    follower.offset = server.log_path.stat().st_size if server.log_path.exists() else 0
    ui.say(f"serving {attempt.loaded.profile.served_name} at {attempt.base_url} (Ctrl-C or SIGTERM stops it)")
    with forwarded_signals() as serving_gate:
        serving_gate.armed = False
        while serving_gate.received is None and gate.received is None and server.exit_code() is None:
            ui.log_lines([redact(line, attempt.secrets) for line in follower.new_lines()])
            time.sleep(0.2)
        code = server.exit_code()
        if code is not None:
            ui.warn(
                f"vLLM exited by itself with code {code}; last log lines:\n{_short_tail(server.log_tail())}"
            )
            server.stop()
            return EXIT_FAIL
        signum = serving_gate.received or gate.received
        ui.say(f"{signal.Signals(signum or signal.SIGTERM).name} received: stopping vLLM ...")
        server.stop()
        ui.say("vLLM stopped; nothing left running")
    return EXIT_PASS


def _deploykit_version() -> str:
    from deploykit import __version__

    return __version__


# --- `deploykit smoke` against a running server -----------------------------------------------------


class SmokeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    profile: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = None
    store_url: str | None = None
    store: bool = True


def run_remote_smoke(options: SmokeOptions, ui: ConsoleUI | None = None) -> int:
    """Smoke a server that is already running; stores one row unless told not to."""
    from deploykit.plan import resolve_model_path
    from deploykit.profile import ProfileError, SmokeCase, load_profile
    from deploykit.smoke import derive_cases, run_smoke, smoke_requests, special_token_ids
    from deploykit.store import ResultRecord

    ui = ui or ConsoleUI(quiet=True)
    started = time.monotonic()
    record = ResultRecord(command="smoke", verdict="error", stage="profile", base_url=options.url)
    record.versions = {"deploykit": _deploykit_version()}
    secrets = secret_values(None, os.environ)
    try:
        if options.profile is not None:
            try:
                loaded = load_profile(options.profile)
            except ProfileError as exc:
                raise ServeFailure("profile", f"the profile cannot be used: {_issues(exc)}") from None
            profile = loaded.profile
            record.profile_name, record.profile_id = profile.name, loaded.id
            served = options.model or profile.served_name
            adapters = list(profile.serve.lora.adapters)
            requests = smoke_requests(derive_cases(profile), served, adapters[0] if adapters else None)
            timeout = options.timeout_s or profile.smoke.timeout_s
            key_env = options.api_key_env or profile.serve.api_key_env
            special = special_token_ids(resolve_model_path(profile))
        elif options.model is not None:
            record.profile_name = None
            requests = smoke_requests([SmokeCase(kind="completion"), SmokeCase(kind="chat")], options.model)
            timeout = options.timeout_s or 120.0
            key_env = options.api_key_env
            special = frozenset()
        else:
            raise ServeFailure("profile", "give --profile P or --model NAME")
        api_key = None
        if key_env:
            api_key = os.environ.get(key_env)
            if not api_key:
                raise ServeFailure("secrets", f"the API key variable {key_env} is not set")
        record.stage = "smoke"
        ui.say(f"smoke: {len(requests)} request(s) against {options.url}")
        report = run_smoke(
            options.url, requests, timeout_s=timeout, api_key=api_key, special_ids=special, on_case=ui.case
        )
        record.verdict = "pass" if report.passed else "fail"
        record.stage = "done"
        record.diagnosis = report.diagnosis
        record.cases = report.cases
        record.timings = {"smoke_s": round(report.elapsed_s, 4)}
        record.timings.update({f"case_{c.name}_s": c.latency_s for c in report.cases})
    except ServeFailure as exc:
        record.stage, record.diagnosis = exc.stage, str(exc)
    record.timings["total_s"] = round(time.monotonic() - started, 4)
    record.diagnosis = redact(record.diagnosis, secrets)
    if options.store:
        result_id, where = _store(record, options.store_url, ui)
    else:
        result_id, where = None, ""
    _print_verdict(record, result_id, where, ui)
    return exit_code_for(record)


def format_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


OnCase = Callable[["CaseResult"], None]
