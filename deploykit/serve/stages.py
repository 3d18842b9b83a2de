"""One attempt's life cycle, each stage written once: load the profile, probe, plan, check every address the
run will listen on, resolve the launch environment, build the model, launch vLLM, wait until it is healthy,
smoke it (with the fix check), make its row, store it.

`deploykit serve` (serve/attempt.py), the restart in serving mode (serve/watch.py), `deploykit smoke --url`
(serve/remote_smoke.py) and `deploykit trace` (trace/run.py) compose these. A stage that cannot go on
raises `StageFailure` naming itself; the one driver (serve/driver.py) turns it, or anything else that ends
the stages, into the command's one row, and the row says where.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from deploykit import __version__, net
from deploykit.endpoint import Endpoint
from deploykit.logtail import tail
from deploykit.serve.driver import Outcome, Stage, StageClock, drive
from deploykit.serve.driver import (
    StageFailure as StageFailure,  # raised by every stage; defined with the driver
)
from deploykit.serve.helpers import (
    overhead,
    plan_for_store,
    profile_issues,
    redact,
    resolve_executable,
)
from deploykit.serve.options import ServeOptions
from deploykit.serve.signals import SignalGate

if TYPE_CHECKING:
    from deploykit.fleet_baseline import FingerprintCheck
    from deploykit.plan import Plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import LoadedProfile, Profile
    from deploykit.results.record import ResultRecord, Verdict
    from deploykit.serve.console import ConsoleUI
    from deploykit.serve.launch import ServerProcess
    from deploykit.smoke import CaseResult, SmokeReport
    from deploykit.smoke.fingerprint import Fingerprint


@dataclass
class Attempt:
    """Everything known about one serve attempt (the first start or a restart) so far; becomes its row."""

    options: ServeOptions
    started: float = field(default_factory=time.monotonic)
    stage: str = Stage.PROFILE.value
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
    fixes_active: dict[str, str] | None = None
    fingerprint: Fingerprint | None = None
    fingerprint_check: FingerprintCheck | None = None
    """The key and settings the fingerprint was taken with: serving mode's canary compares with the same."""

    clock: StageClock = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.clock = StageClock(self)

    def enter(self, stage: Stage) -> None:
        """Move on to `stage`, the one it leaves timed."""
        self.clock.enter(stage)

    def mark(self, key: str, since: float) -> None:
        self.timings[key] = round(time.monotonic() - since, 4)


# --- before vLLM starts ------------------------------------------------------------------------------


def load(reference: str) -> LoadedProfile:
    """The profile by name or path; one that cannot be used fails the `profile` stage, naming its issues."""
    from deploykit.profile.load import load_profile
    from deploykit.profile.schema import ProfileError

    try:
        return load_profile(reference)
    except ProfileError as exc:
        raise StageFailure(Stage.PROFILE, f"the profile cannot be used: {profile_issues(exc)}") from None


def probe_machine() -> tuple[ProbeFacts, dict[str, str | None]]:
    """This machine's facts, and the versions a row records (deploykit, vLLM, torch)."""
    from deploykit.probe.load import probe

    facts = probe()
    return facts, {"deploykit": __version__, "vllm": facts.vllm_version, "torch": facts.torch_version}


def check_plan(plan: Plan) -> None:
    """A plan with errors fails the `plan` stage, every error named."""
    if plan.errors:
        raise StageFailure(Stage.PLAN, "the plan has errors: " + "; ".join(plan.errors))


def check_launchable(plan: Plan) -> None:
    """A plan this host must not launch is refused (exit 2, a plan error) before anything starts: its
    decisions are for another vLLM release than the one installed here, or it spans several nodes."""
    from deploykit.errors import PlanError
    from deploykit.plan import host_vllm_mismatch, multi_node_refusal

    if mismatch := host_vllm_mismatch(plan):
        way_out = f"install vLLM {plan.vllm_version} here, or change the profile's vllm_version"
        raise PlanError(f"refused: {mismatch}: {way_out}")
    if multi_node := multi_node_refusal(plan.layout):
        raise PlanError(f"refused: {multi_node}")


class ListenAddress(NamedTuple):
    """An address the run will listen on: what listens there, and the option that moves it."""

    what: str
    host: str
    port: int
    way_out: str


def check_listen_addresses(addresses: Sequence[ListenAddress]) -> None:
    """Every address the run will listen on, checked before any model loads: free now, and no two on the
    same port of one host (a wildcard host overlaps every host). Port 0 (any free port) always passes."""
    for index, address in enumerate(addresses):
        if address.port == 0:
            continue
        for earlier in addresses[:index]:
            same_host = address.host == earlier.host or net.is_wildcard(address.host)
            if earlier.port == address.port and (same_host or net.is_wildcard(earlier.host)):
                raise StageFailure(
                    Stage.PORT,
                    f"{address.what} and {earlier.what} both ask for port {address.port} on "
                    f"{address.host}; {address.way_out}",
                )
        if net.port_in_use(address.port, address.host):
            where = "" if index == 0 else f" ({address.what})"
            raise StageFailure(
                Stage.PORT,
                f"port {address.port} on {address.host} is already in use{where}; stop what listens there "
                f"or {address.way_out}",
            )


def launch_environment(plan: Plan, parent: Mapping[str, str]) -> dict[str, str]:
    """The launch env: the parent's, the plan's values, and each `${NAME}` reference resolved.

    A referenced variable that is not set fails the `secrets` stage, every missing one named."""
    env = dict(parent)
    env.pop("DEPLOYKIT_FIXES", None)  # only the plan decides which fixes run
    missing = [f"{key} (from ${source})" for key, source in plan.secret_env.items() if not parent.get(source)]
    if missing:
        raise StageFailure(
            Stage.SECRETS,
            f"the profile takes these from the environment, but they are not set: {', '.join(missing)}",
        )
    for variable in plan.secret_env.values():  # each travels in a header (the API key, HF_TOKEN): checked
        try:
            net.secret_from_env(variable, parent, what="secret")
        except net.SecretRefused as exc:
            raise StageFailure(Stage.SECRETS, str(exc)) from None
    for key, value in plan.env.items():
        source = plan.secret_env.get(key)
        env[key] = parent[source] if source is not None else value
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def ensure_model(plan: Plan, source: str, say: Callable[[str], None]) -> None:
    """Make a builtin model on first use (cached); a missing local path is vLLM's to report."""
    from deploykit import builtin_models
    from deploykit.errors import DeploykitError
    from deploykit.paths import default_cache_dir
    from deploykit.profile.schema import BUILTIN_PREFIX

    if not source.startswith(BUILTIN_PREFIX):
        return
    name = source[len(BUILTIN_PREFIX) :]
    if builtin_models.is_ready(name, plan.model_path):
        return
    say(f"{builtin_models.first_use_line(name)}, cached in {default_cache_dir()} ...")
    try:
        built = builtin_models.make(name)
    except DeploykitError as exc:
        raise StageFailure(Stage.MODEL, exc.message) from None
    if str(built) != plan.model_path:
        raise StageFailure(
            Stage.MODEL, f"the builtin model was made at {built}, but the plan expects {plan.model_path}"
        )


# --- vLLM ----------------------------------------------------------------------------------------------


def start_vllm(
    argv: Sequence[str], env: Mapping[str, str], *, log_path: Path, host: str, port: int
) -> ServerProcess:
    """vLLM in its own process group, its log in `log_path`; `host` is the host it binds (`--host`)."""
    from deploykit.serve.launch import LaunchError, start_server

    try:
        return start_server(resolve_executable(argv), env, log_path=log_path, host=host, port=port)
    except LaunchError as exc:
        raise StageFailure(Stage.LAUNCH, str(exc)) from None


def wait_healthy(
    server: ServerProcess,
    timeout_s: float,
    on_progress: Callable[[float, str], None] | None = None,
) -> float:
    """Seconds until vLLM's /health answered. A vLLM that exits or stays silent past `timeout_s` fails the
    `startup` stage with its last log lines."""
    from deploykit.serve.launch import LaunchError

    try:
        return server.wait_healthy(timeout_s, on_progress, poll_s=0.2)
    except LaunchError as exc:
        if exc.server_exit_code is not None:
            message = f"vLLM exited during start-up with code {exc.server_exit_code}"
        else:
            message = f"vLLM did not become healthy within {timeout_s:g} s (start-up timeout)"
        raise StageFailure(Stage.STARTUP, f"{message}; last log lines:\n{tail(exc.log_tail)}") from None


# --- the smoke -----------------------------------------------------------------------------------------


def profile_api_key(profile: Profile, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key the profile's server expects (its `serve.api_key_env`), when it has one; one that could not
    travel in a header unchanged is refused naming the variable, never showing the value."""
    if not profile.serve.api_key_env:
        return None
    try:
        return net.secret_from_env(profile.serve.api_key_env, environ)
    except net.SecretRefused as exc:
        raise StageFailure(Stage.SECRETS, str(exc)) from None


def profile_endpoint(profile: Profile, base_url: str, environ: Mapping[str, str] = os.environ) -> Endpoint:
    """The profile's server at `base_url` as the clients take it: its key (`profile_api_key`) and the
    smoke's per-request deadline."""
    return Endpoint(
        base_url, api_key=profile_api_key(profile, environ), request_deadline_s=profile.smoke.timeout_s
    )


def smoke_attempt(attempt: Attempt, ui: ConsoleUI) -> SmokeReport:
    """The profile's smoke cases and the plan's fix check against the attempt's server."""
    from deploykit.smoke import requests_for_profile, special_token_ids, vocab_size
    from deploykit.smoke.fix_check import smoke_with_fix_check

    assert attempt.loaded is not None and attempt.plan is not None and attempt.base_url is not None
    profile = attempt.loaded.profile
    attempt.enter(Stage.SMOKE)
    requests = requests_for_profile(profile)
    ui.say(f"smoke: {len(requests)} request(s) against {net.redact_url(attempt.base_url)}")
    report, status = smoke_with_fix_check(
        profile_endpoint(profile, attempt.base_url),
        requests,
        expected=attempt.plan.enabled_fixes,
        special_ids=special_token_ids(attempt.plan.model_path),
        vocab_size=vocab_size(attempt.plan.model_path),
        tie_tolerance=profile.smoke.tie_tolerance,
        logprob_tolerance=profile.smoke.logprob_tolerance,
        on_case=ui.case,
    )
    attempt.fixes_active = status.fixes_active
    if report.passed and profile.smoke.fingerprint.enabled:
        report = _with_fingerprint(attempt, report, ui)
    attempt.report = report
    attempt.timings["smoke_s"] = round(report.elapsed_s, 4)
    attempt.timings["requests_s"] = round(sum(case.latency_s for case in report.cases), 4)
    attempt.timings.update(case_timings(report.cases))
    return report


def fingerprint_check_for(attempt: Attempt) -> FingerprintCheck:
    """The attempt's fingerprint key (its plan, this machine, the fixes the server reported) and settings."""
    from deploykit.fleet_baseline import FingerprintCheck, key_parts_for_plan

    assert attempt.loaded is not None and attempt.plan is not None
    settings = attempt.loaded.profile.smoke.fingerprint
    parts, dtype = key_parts_for_plan(
        attempt.loaded.profile, attempt.plan, attempt.fixes_active, settings.top_k
    )
    return FingerprintCheck(
        key_parts=parts,
        dtype=dtype,
        top_k=settings.top_k,
        store_url=attempt.options.store_url,
        tolerance=settings.logprob_tolerance,
    )


def _with_fingerprint(attempt: Attempt, report: SmokeReport, ui: ConsoleUI) -> SmokeReport:
    """The probe set's fingerprint compared with its key's baseline, as one more case."""
    from deploykit.fleet_baseline import fingerprint_case, with_case

    assert attempt.loaded is not None and attempt.base_url is not None
    profile = attempt.loaded.profile
    attempt.fingerprint_check = check = fingerprint_check_for(attempt)
    case, attempt.fingerprint = fingerprint_case(
        check, profile_endpoint(profile, attempt.base_url), profile.served_name, readings=2
    )
    ui.case(case)
    return with_case(report, case)


def case_timings(cases: Sequence[CaseResult]) -> dict[str, float | None]:
    """Each case's latency as a row's timing (`case_NAME_s`)."""
    return {f"case_{case.name}_s": case.latency_s for case in cases}


# --- the verdict and the row ---------------------------------------------------------------------------


def run_to_verdict(
    attempt: Attempt,
    stages: Callable[[], SmokeReport],
    context: str = "",
    gate: SignalGate | None = None,
) -> Outcome:
    """Run `stages` (up to and including the smoke) through the one driver: the smoke's verdict, or how
    the stages ended. Never raises an Exception."""

    def judged() -> tuple[Verdict, str]:
        report = stages()
        return ("pass" if report.passed else "fail"), report.diagnosis

    return drive(attempt.clock, judged, gate=gate, context=context)


def attempt_record(attempt: Attempt, verdict: str, diagnosis: str) -> ResultRecord:
    """The attempt as its stored row."""
    from deploykit.results.record import ResultRecord

    attempt.mark("total_s", attempt.started)
    attempt.timings["overhead_s"] = round(overhead(attempt.timings), 4)
    # CPU this process used since it started (imports included, vLLM's processes not): load-proof overhead.
    attempt.timings["deploykit_cpu_s"] = round(time.process_time(), 4)
    loaded, plan = attempt.loaded, attempt.plan
    log_tail = attempt.server.log_tail(60) if attempt.server is not None else ""
    return ResultRecord(
        command="serve",
        profile_name=loaded.profile.name if loaded else attempt.options.profile,
        profile_id=loaded.id if loaded else None,
        verdict=verdict,
        stage=attempt.stage,
        diagnosis=redact(diagnosis, attempt.secrets),
        base_url=attempt.base_url,
        facts=attempt.facts,
        plan=plan_for_store(plan, attempt.argv) if plan else None,
        versions=attempt.versions or {"deploykit": __version__},
        timings=attempt.timings,
        cases=attempt.report.cases if attempt.report else [],
        fixes_active=attempt.fixes_active,
        fingerprint=attempt.fingerprint,
        log_path=str(attempt.server.log_path) if attempt.server else None,
        log_tail=redact(log_tail, attempt.secrets),
    )
