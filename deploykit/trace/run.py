"""`deploykit trace`: plan the profile, start vLLM eager with one sequence at a time and the trace hooks,
run the case(s), stop vLLM, read what the hooks wrote, name the culprit, store one row (command `trace`).

The stages up to a healthy vLLM, and the row's storing, are serve's (`deploykit.serve.stages`); the cases
are judged before vLLM starts, so a case the profile's server cannot answer is refused at once.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from deploykit import exit_codes
from deploykit.argv import apply_args
from deploykit.files import make_private_dirs
from deploykit.plugin_contract import TRACE_ENV
from deploykit.profile.schema import FixMode
from deploykit.serve.driver import INPUT_STAGES, Stage, StageClock, drive, exit_code, finish
from deploykit.serve.stages import StageFailure

if TYPE_CHECKING:
    from deploykit.endpoint import Endpoint
    from deploykit.profile.schema import Profile, SmokeCase
    from deploykit.results.record import ResultRecord, Verdict
    from deploykit.serve.launch import ServerProcess
    from deploykit.smoke import CaseResult, SmokeRequest
    from deploykit.trace.report import TraceReport

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


def trace_argv(argv: Sequence[str], port: int) -> list[str]:
    """The planned argv made traceable: eager (hooks need the Python forward), one sequence at a time (NaN
    spreads across the rows of a batch), on `port`."""
    return apply_args(argv, ["--port", str(port), "--enforce-eager", "--max-num-seqs", "1"])


def trace_cases(
    profile: Profile, case: str | None, prompt: str | None, max_tokens: int | None
) -> list[SmokeCase]:
    """The cases to trace: one prompt, one kind, or the profile's own. A kind the profile's server cannot
    answer (an image for a text-only model, a LoRA case without an adapter) fails the `cases` stage."""
    from deploykit.profile.schema import SmokeCase
    from deploykit.smoke import derive_cases

    if prompt is not None:
        cases = [SmokeCase(kind="completion", prompt=prompt)]
    elif case is not None:
        refusal = unservable_case(profile, case)
        if refusal:
            raise StageFailure(Stage.CASES, f"--case {case}: {refusal}")
        derived = [c for c in derive_cases(profile) if c.kind == case]
        cases = derived or [SmokeCase.model_validate({"kind": case})]
    else:
        cases = derive_cases(profile)
    if max_tokens is not None:
        cases = [c.model_copy(update={"max_tokens": max_tokens}) for c in cases]
    return cases


def unservable_case(profile: Profile, kind: str) -> str:
    """Why the profile's server cannot answer a case of `kind` (empty when it can)."""
    if kind == "image" and not profile.model.multimodal:
        return (
            f"profile {profile.name} serves a text-only model (model.multimodal is false), which refuses "
            "images; pick another case, or a multimodal profile"
        )
    if kind == "lora_long" and not (profile.serve.lora.enabled and profile.serve.lora.adapters):
        return (
            f"profile {profile.name} serves no LoRA adapter (serve.lora), so there is nothing for this "
            "case to check; pick another case, or a profile with an adapter"
        )
    return ""


def request_id(index: int, request: SmokeRequest) -> str:
    return f"{REQUEST_ID_PREFIX}-{index}-{request.name.replace('#', '_')}"


def send_cases(
    endpoint: Endpoint,
    requests: Sequence[SmokeRequest],
    *,
    special_ids: frozenset[int],
    on_case: Any = None,
) -> tuple[list[CaseResult], dict[str, str]]:
    """One request at a time, each with its own X-Request-Id (the hooks' traces are named by it) and within
    the endpoint's request deadline; stops after the first that fails."""
    from deploykit.smoke.client import Server, judged, send

    results: list[CaseResult] = []
    names: dict[str, str] = {}
    for index, request in enumerate(requests):
        rid = request_id(index, request)
        names[rid] = request.name
        server = Server(endpoint, {"X-Request-Id": rid})
        result = judged(request, send(server, request), special_ids)
        results.append(result)
        if on_case is not None:
            on_case(result)
        if not result.passed:
            break
    return results, names


def run_trace(options: TraceOptions, say: Any = None) -> tuple[int, TraceReport | None]:
    """One trace attempt; returns (exit code, report). Stores exactly one row whatever happens: the stages
    run in the one driver (serve/driver.py), so a failed stage, any exception and SIGINT/SIGTERM (a vLLM it
    started is stopped first) each end in the row."""
    from deploykit import __version__
    from deploykit.results.record import ResultRecord
    from deploykit.serve.helpers import redact, secret_values
    from deploykit.serve.signals import forwarded_signals

    say = say or (lambda message: None)
    record = ResultRecord(
        command="trace", verdict="error", stage=Stage.PROFILE.value, profile_name=options.profile
    )
    record.versions = {"deploykit": __version__}
    run = _TraceRun(options=options, record=record, say=say, secrets=secret_values(None, os.environ))
    clock = StageClock(record)
    with forwarded_signals() as gate:
        try:
            outcome = drive(clock, lambda: run.stages(clock), gate=gate, usage_stages=INPUT_STAGES)
        finally:
            gate.armed = False
            run.stop_server()
        record.verdict = outcome.verdict
        record.diagnosis = redact(outcome.diagnosis, run.secrets)
        record.timings["total_s"] = round(time.monotonic() - clock.started, 4)
        finish(record, options.store_url, say, say, brief=True)
    code = exit_code(record, outcome, gate)
    if record.verdict == "error" and outcome.exit_code is None:
        code = exit_codes.FAILED
    return code, run.report


@dataclass
class _TraceRun:
    """One trace's state while its stages run: what `stop_server` must stop, and the report."""

    options: TraceOptions
    record: ResultRecord
    say: Any
    secrets: list[str]
    server: ServerProcess | None = None
    report: TraceReport | None = None

    def stop_server(self) -> None:
        """Stop a vLLM the stages left running (an error or a signal ended them), keeping its log's tail."""
        from deploykit.serve.helpers import redact

        if self.server is not None:
            server, self.server = self.server, None
            server.stop()
            self.record.log_tail = redact(server.log_tail(60), self.secrets)

    def stages(self, clock: StageClock) -> tuple[Verdict, str]:
        from deploykit.net import free_port
        from deploykit.paths import default_log_dir
        from deploykit.plan import make_plan
        from deploykit.serve.console import log_echo
        from deploykit.serve.helpers import plan_for_store, redact, secret_values
        from deploykit.serve.stages import (
            check_launchable,
            check_plan,
            ensure_model,
            launch_environment,
            load,
            probe_machine,
            profile_endpoint,
            start_vllm,
            wait_healthy,
        )
        from deploykit.smoke import requests_for_profile, special_token_ids
        from deploykit.trace.report import analyse, read_trace_dir, render_text

        options, record, say = self.options, self.record, self.say
        loaded = load(options.profile)
        profile = loaded.profile
        record.profile_name, record.profile_id = profile.name, loaded.id
        clock.enter(Stage.CASES)
        cases = trace_cases(profile, options.case, options.prompt, options.max_tokens)
        clock.enter(Stage.PROBE)
        facts, versions = probe_machine()
        record.facts = facts.model_dump(mode="json")
        record.versions.update(versions)
        clock.enter(Stage.PLAN)
        plan = make_plan(loaded, facts, options.overrides)
        check_plan(plan)
        check_launchable(plan)
        self.secrets = secret_values(plan, os.environ)
        port = free_port()
        argv = trace_argv(plan.argv, port)
        record.plan = plan_for_store(plan, argv)
        record.base_url = base_url = f"http://127.0.0.1:{port}"
        clock.enter(Stage.SECRETS)
        env = launch_environment(plan, os.environ)
        log_dir = options.log_dir or default_log_dir()
        make_private_dirs(log_dir)  # the traces hold prompts' activations: the owner's alone
        directory = Path(tempfile.mkdtemp(prefix=f"trace-{profile.name}-", dir=log_dir))
        env[TRACE_ENV] = str(directory)
        clock.enter(Stage.MODEL)
        ensure_model(plan, profile.model.source, say)
        clock.enter(Stage.LAUNCH)
        log_path = directory / "vllm.log"
        launch_started = time.monotonic()
        self.server = server = start_vllm(argv, env, log_path=log_path, host="127.0.0.1", port=port)
        record.log_path = str(log_path)
        say(f"vLLM started for the trace (eager, --max-num-seqs 1), pid {server.pid}, log {log_path}")
        clock.enter(Stage.STARTUP)
        echo = None if options.quiet else log_echo(log_path, say, lambda line: redact(line, self.secrets))
        startup = wait_healthy(server, profile.deploy.startup_timeout_s, echo)
        record.timings["startup_s"] = round(startup, 4)
        say(f"vLLM healthy after {startup:.1f} s")
        clock.enter(Stage.REQUESTS)
        requests = requests_for_profile(profile, cases)
        requests_started = time.monotonic()
        results, names = send_cases(
            profile_endpoint(profile, base_url),
            requests,
            special_ids=special_token_ids(plan.model_path),
            on_case=lambda r: say(
                f"  {'ok  ' if r.passed else 'FAIL'} {r.name:<12} ids {r.first_ids[:8]}"
                + (f"  {r.diagnosis}" if r.diagnosis else "")
            ),
        )
        record.timings["requests_s"] = round(time.monotonic() - requests_started, 4)
        record.cases = results
        if echo is not None:  # --verbose: vLLM's lines for the requests too
            echo()
        clock.enter(Stage.STOP)
        stop_started = time.monotonic()
        self.stop_server()
        record.timings["stop_s"] = round(time.monotonic() - stop_started, 4)
        record.timings["server_s"] = round(time.monotonic() - launch_started, 4)
        clock.enter(Stage.REPORT)
        self.report = report = analyse(read_trace_dir(directory), names)
        if report.modules_hooked == 0:
            raise StageFailure(
                Stage.REPORT,
                f"no trace was written to {directory}: the deploykit plugin did not hook the model "
                "(is deploykit installed in vLLM's environment, and VLLM_PLUGINS not excluding it?)",
            )
        smoke_passed = bool(results) and all(r.passed for r in results)
        return ("pass" if smoke_passed and not report.nonfinite_found else "fail"), render_text(report)
