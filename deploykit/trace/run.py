"""`deploykit trace`: plan the profile, start vLLM eager with one sequence at a time and the trace hooks,
run the case(s), stop vLLM, read what the hooks wrote, name the culprit, store one row (command `trace`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from deploykit.profile.schema import FixMode
from deploykit.trace import TRACE_ENV

if TYPE_CHECKING:
    from deploykit.profile.schema import Profile, SmokeCase
    from deploykit.smoke import CaseResult, SmokeRequest
    from deploykit.trace.report import TraceReport

EXIT_CLEAN = 0
EXIT_FOUND = 1
EXIT_ERROR = 2
REQUEST_ID_PREFIX = "dktrace"


class TraceOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str
    overrides: dict[str, FixMode] = Field(default_factory=dict)
    case: str | None = Field(default=None, description="one smoke case kind instead of the profile's")
    prompt: str | None = Field(default=None, description="one completion with this prompt")
    store_url: str | None = None
    log_dir: Path | None = None
    quiet: bool = True
    max_tokens: int | None = None


class TraceFailure(Exception):
    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


def trace_argv(argv: Sequence[str], port: int) -> list[str]:
    """The planned argv made traceable: eager (hooks need the Python forward), one sequence at a time (NaN
    spreads across the rows of a batch), on `port`."""
    from deploykit.serve.helpers import with_port

    result = with_port(argv, port)
    if "--enforce-eager" not in result:
        result.append("--enforce-eager")
    if "--max-num-seqs" in result:
        result[result.index("--max-num-seqs") + 1] = "1"
    else:
        result += ["--max-num-seqs", "1"]
    return result


def trace_cases(
    profile: Profile, case: str | None, prompt: str | None, max_tokens: int | None
) -> list[SmokeCase]:
    from deploykit.profile.schema import SmokeCase
    from deploykit.smoke import derive_cases

    if prompt is not None:
        cases = [SmokeCase(kind="completion", prompt=prompt)]
    elif case is not None:
        derived = [c for c in derive_cases(profile) if c.kind == case]
        cases = derived or [SmokeCase.model_validate({"kind": case})]
    else:
        cases = derive_cases(profile)
    if max_tokens is not None:
        cases = [c.model_copy(update={"max_tokens": max_tokens}) for c in cases]
    return cases


def request_id(index: int, request: SmokeRequest) -> str:
    return f"{REQUEST_ID_PREFIX}-{index}-{request.name.replace('#', '_')}"


def send_cases(
    base_url: str,
    requests: Sequence[SmokeRequest],
    *,
    timeout_s: float,
    api_key: str | None,
    special_ids: frozenset[int],
    on_case: Any = None,
) -> tuple[list[CaseResult], dict[str, str]]:
    """One request at a time, each with its own X-Request-Id; stops after the first that fails."""
    import httpx

    from deploykit.smoke import judge, send

    results: list[CaseResult] = []
    names: dict[str, str] = {}
    for index, request in enumerate(requests):
        rid = request_id(index, request)
        names[rid] = request.name
        headers = {"X-Request-Id": rid, **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        with httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s) as client:
            result = judge(request, send(client, request, timeout_s), special_ids)
        results.append(result)
        if on_case is not None:
            on_case(result)
        if not result.passed:
            break
    return results, names


def run_trace(options: TraceOptions, say: Any = None) -> tuple[int, TraceReport | None]:
    """One trace attempt; returns (exit code, report). Stores exactly one row whatever happens."""
    from deploykit.net import free_port
    from deploykit.paths import default_log_dir
    from deploykit.plan import make_plan
    from deploykit.probe.load import probe
    from deploykit.profile.load import load_profile
    from deploykit.profile.schema import ProfileError
    from deploykit.serve.console import ConsoleUI
    from deploykit.serve.helpers import (
        child_environment,
        plan_for_store,
        redact,
        resolve_executable,
        secret_values,
    )
    from deploykit.serve.launch import LaunchError, start_server
    from deploykit.smoke import smoke_requests, special_token_ids
    from deploykit.store import ResultRecord
    from deploykit.trace.report import analyse, read_trace_dir, render_text

    say = say or (lambda message: None)
    started = time.monotonic()
    record = ResultRecord(command="trace", verdict="error", stage="profile", profile_name=options.profile)
    record.versions = {"deploykit": _deploykit_version()}
    secrets: list[str] = secret_values(None, os.environ)
    server = None
    report: TraceReport | None = None
    code = EXIT_ERROR
    try:
        try:
            loaded = load_profile(options.profile)
        except ProfileError as exc:
            issues = "; ".join(str(issue) for issue in exc.issues) or str(exc)
            raise TraceFailure("profile", f"the profile cannot be used: {issues}") from None
        profile = loaded.profile
        record.profile_name, record.profile_id = profile.name, loaded.id
        record.stage = "probe"
        facts = probe()
        record.facts = facts.model_dump(mode="json")
        record.versions.update({"vllm": facts.vllm_version, "torch": facts.torch_version})
        record.stage = "plan"
        plan = make_plan(loaded, facts, options.overrides)
        if plan.errors:
            raise TraceFailure("plan", "the plan has errors: " + "; ".join(plan.errors))
        secrets = secret_values(plan, os.environ)
        port = free_port()
        argv = trace_argv(plan.argv, port)
        record.plan = plan_for_store(plan, argv)
        record.base_url = base_url = f"http://127.0.0.1:{port}"
        env = child_environment(plan, os.environ)
        log_dir = options.log_dir or default_log_dir()
        log_dir.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix=f"trace-{profile.name}-", dir=log_dir))
        env[TRACE_ENV] = str(directory)
        record.stage = "model"
        from deploykit.serve.attempt import ensure_model

        ensure_model(plan, profile.model.source, ConsoleUI(quiet=True))
        record.stage = "launch"
        log_path = directory / "vllm.log"
        launch_started = time.monotonic()
        try:
            server = start_server(
                resolve_executable(argv), env, log_path=log_path, host="127.0.0.1", port=port
            )
        except LaunchError as exc:
            raise TraceFailure("launch", str(exc)) from None
        record.log_path = str(log_path)
        say(f"vLLM started for the trace (eager, --max-num-seqs 1), pid {server.pid}, log {log_path}")
        record.stage = "startup"
        try:
            startup = server.wait_healthy(profile.deploy.startup_timeout_s, poll_s=0.2)
        except LaunchError as exc:
            tail = "\n".join(exc.log_tail.strip().splitlines()[-12:])
            raise TraceFailure("startup", f"{exc}; last log lines:\n{tail}") from None
        record.timings["startup_s"] = round(startup, 4)
        say(f"vLLM healthy after {startup:.1f} s")
        record.stage = "requests"
        cases = trace_cases(profile, options.case, options.prompt, options.max_tokens)
        adapters = list(profile.serve.lora.adapters)
        requests = smoke_requests(cases, profile.served_name, adapters[0] if adapters else None)
        api_key = os.environ.get(profile.serve.api_key_env) if profile.serve.api_key_env else None
        requests_started = time.monotonic()
        results, names = send_cases(
            base_url,
            requests,
            timeout_s=profile.smoke.timeout_s,
            api_key=api_key,
            special_ids=special_token_ids(plan.model_path),
            on_case=lambda r: say(
                f"  {'ok  ' if r.passed else 'FAIL'} {r.name:<12} ids {r.first_ids[:8]}"
                + (f"  {r.diagnosis}" if r.diagnosis else "")
            ),
        )
        record.timings["requests_s"] = round(time.monotonic() - requests_started, 4)
        record.cases = results
        record.stage = "stop"
        stop_started = time.monotonic()
        server.stop()
        record.timings["stop_s"] = round(time.monotonic() - stop_started, 4)
        record.timings["server_s"] = round(time.monotonic() - launch_started, 4)
        record.log_tail = redact(server.log_tail(60), secrets)
        server = None
        record.stage = "report"
        report = analyse(read_trace_dir(directory), names)
        if report.modules_hooked == 0:
            raise TraceFailure(
                "report",
                f"no trace was written to {directory}: the deploykit plugin did not hook the model "
                "(is deploykit installed in vLLM's environment, and VLLM_PLUGINS not excluding it?)",
            )
        smoke_passed = bool(results) and all(r.passed for r in results)
        record.verdict = "pass" if smoke_passed and not report.nonfinite_found else "fail"
        record.stage = "done"
        record.diagnosis = render_text(report)
        code = EXIT_CLEAN if record.verdict == "pass" else EXIT_FOUND
    except TraceFailure as exc:
        record.stage, record.diagnosis = exc.stage, str(exc)
    except KeyboardInterrupt:
        record.verdict, record.diagnosis = "interrupted", f"interrupted during {record.stage}"
        code = 130
    finally:
        if server is not None:
            server.stop()
            record.log_tail = redact(server.log_tail(60), secrets)
    record.timings["total_s"] = round(time.monotonic() - started, 4)
    record.diagnosis = redact(record.diagnosis, secrets)
    stored = _store(record, options.store_url)
    say(stored)
    if record.verdict == "error":
        say(f"trace: ERROR at {record.stage}: {record.diagnosis}")
    return code, report


def _store(record: Any, url: str | None) -> str:
    from deploykit.store import StoreError, open_store

    try:
        store = open_store(url)
    except StoreError as exc:
        return f"the result could not be stored: {exc}"
    try:
        result_id = store.add(record)
        return f"result #{result_id} stored in {store.display_url}"
    finally:
        store.close()


def _deploykit_version() -> str:
    from deploykit import __version__

    return __version__
