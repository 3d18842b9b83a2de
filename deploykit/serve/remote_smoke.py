"""`deploykit smoke`: the smoke cases against a server that is already running (local or remote).

It also runs as the Helm chart's test pod inside the vLLM image, with only the packages vLLM brought: with
--no-store and --expect-fixes it needs neither SQLAlchemy (the store), platformdirs (the default store's
directory) nor nvidia-ml-py (a probe of this machine, for the planned fixes); each is imported only on the
path that uses it, and a path that needs a missing one ends in a `deploykit: ...` line naming it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from deploykit import __version__, net
from deploykit.endpoint import Endpoint
from deploykit.serve.console import ConsoleUI
from deploykit.serve.driver import Stage, StageClock, drive, exit_code, finish
from deploykit.serve.helpers import redact, secret_values
from deploykit.serve.signals import forwarded_signals
from deploykit.serve.stages import StageFailure, case_timings, check_plan, load

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.profile.schema import LoadedProfile
    from deploykit.results.record import ResultRecord, Verdict
    from deploykit.results.store import Store
    from deploykit.smoke import SmokeReport
    from deploykit.smoke.fingerprint import Fingerprint


class SmokeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str
    profile: str | None = None
    model: str | None = None
    api_key_env: str | None = None
    timeout_s: float | None = None
    store_url: str | None = None
    store: bool = True
    expect_fixes: list[str] | None = None
    """The fixes that must be active on the server; None: the plan's (`profile` and `facts`), else none."""
    facts: str | None = None
    """A saved probe of the server's machine, for the plan's fixes (default: probe this machine)."""


def planned(loaded: LoadedProfile, facts_file: str | None) -> Plan:
    """The profile's plan on the server's GPU (a saved probe, or this machine): its fixes are the ones to
    expect, and its key is the fingerprint's. Made once per smoke."""
    from deploykit.plan import make_plan
    from deploykit.probe.load import ProbeError, load_facts, probe

    if facts_file is None and loaded.profile.platform != "cpu":
        from deploykit.probe.nvml_reader import require_nvml

        require_nvml(
            "planning the fixes to expect on the server (a probe of this machine's GPUs)",
            "pass --expect-fixes NAME[,NAME] (or none), or --facts FILE",
        )
    try:
        facts = load_facts(facts_file) if facts_file else probe()
    except ProbeError as exc:
        raise StageFailure(Stage.PLAN, str(exc)) from None
    plan = make_plan(loaded, facts)
    check_plan(plan)
    return plan


def planned_fixes(loaded: LoadedProfile, facts_file: str | None) -> list[str]:
    """The fixes the plan enables for the profile on the server's GPU."""
    return planned(loaded, facts_file).enabled_fixes


def run_remote_smoke(options: SmokeOptions, ui: ConsoleUI | None = None) -> int:
    """Smoke a server that is already running; stores one row unless told not to (the one driver:
    serve/driver.py, so a signal or any exception is the row too)."""
    from deploykit.results.record import ResultRecord
    from deploykit.results.stores import open_store

    ui = ui or ConsoleUI(quiet=True)
    # Opened first: a store that cannot be reached stops here, before any request is sent (a store that
    # goes away later is the spool's: deploykit.results.spool).
    store = open_store(options.store_url) if options.store else None
    try:
        if store is not None:
            check_fits(options, store)
        record = ResultRecord(
            command="smoke", verdict="error", stage=Stage.PROFILE.value, base_url=options.url
        )
        record.versions = {"deploykit": __version__}
        secrets = secret_values(None, os.environ)
        clock = StageClock(record)
        with forwarded_signals() as gate:
            outcome = drive(clock, lambda: _smoke(options, record, clock, ui), gate=gate)
            record.verdict = outcome.verdict
            record.diagnosis = redact(outcome.diagnosis, secrets)
            record.timings["total_s"] = round(time.monotonic() - clock.started, 4)
            finish(record, store, ui.say, ui.warn, keep=store is not None)
    finally:
        if store is not None:
            store.close()
    if outcome.error is not None:
        raise outcome.error
    return exit_code(record, outcome, gate)


def check_fits(options: SmokeOptions, store: Store) -> None:
    """The row's inputs against the store's limits, before any request (`Store.check_fits`)."""
    import socket

    store.check_fits(base_url=options.url, hostname=socket.gethostname())


def _smoke(
    options: SmokeOptions, record: ResultRecord, clock: StageClock, ui: ConsoleUI
) -> tuple[Verdict, str]:
    """The stages of a remote smoke: the profile (or a bare model), its plan, the key, the cases."""
    from deploykit.plan import resolve_model_path
    from deploykit.profile.schema import SmokeCase
    from deploykit.smoke import (
        DEFAULT_LOGPROB_TOLERANCE,
        DEFAULT_TIE_TOLERANCE,
        requests_for_profile,
        smoke_requests,
        special_token_ids,
        vocab_size,
    )
    from deploykit.smoke.fix_check import smoke_with_fix_check

    loaded: LoadedProfile | None = None
    plan: Plan | None = None
    if options.profile is not None:
        loaded = load(options.profile)
        profile = loaded.profile
        record.profile_name, record.profile_id = profile.name, loaded.id
        requests = requests_for_profile(profile, served_name=options.model)
        timeout = options.timeout_s or profile.smoke.timeout_s
        key_env = options.api_key_env or profile.serve.api_key_env
        special = special_token_ids(resolve_model_path(profile))
        vocab = vocab_size(resolve_model_path(profile))
        clock.enter(Stage.PLAN)
        if options.expect_fixes is not None:
            expected = options.expect_fixes
        else:
            plan = planned(loaded, options.facts)
            expected = plan.enabled_fixes
        tie, logprob = profile.smoke.tie_tolerance, profile.smoke.logprob_tolerance
    elif options.model is not None:
        requests = smoke_requests([SmokeCase(kind="completion"), SmokeCase(kind="chat")], options.model)
        timeout = options.timeout_s or 120.0
        key_env = options.api_key_env
        special = frozenset()
        vocab = None
        expected = options.expect_fixes or []
        tie, logprob = DEFAULT_TIE_TOLERANCE, DEFAULT_LOGPROB_TOLERANCE
    else:
        raise StageFailure(Stage.PROFILE, "give --profile P or --model NAME")
    clock.enter(Stage.SECRETS)
    api_key = None
    if key_env:
        try:
            api_key = net.secret_from_env(key_env, os.environ)
        except net.SecretRefused as exc:
            raise StageFailure(Stage.SECRETS, str(exc)) from None
        if not api_key:
            raise StageFailure(Stage.SECRETS, f"the API key variable {key_env} is not set")
    endpoint = Endpoint(options.url, api_key=api_key, request_deadline_s=timeout)
    clock.enter(Stage.SMOKE)
    ui.say(f"smoke: {len(requests)} request(s) against {endpoint.shown}")
    report, status = smoke_with_fix_check(
        endpoint,
        requests,
        expected=expected,
        special_ids=special,
        vocab_size=vocab,
        tie_tolerance=tie,
        logprob_tolerance=logprob,
        on_case=ui.case,
    )
    record.fixes_active = status.fixes_active
    if report.passed and loaded is not None:
        report, record.fingerprint = _with_fingerprint(
            loaded, plan, options, endpoint, status.fixes_active, report, ui
        )
    record.cases = report.cases
    record.timings["smoke_s"] = round(report.elapsed_s, 4)
    record.timings.update(case_timings(report.cases))
    return ("pass" if report.passed else "fail"), report.diagnosis


def _with_fingerprint(
    loaded: LoadedProfile,
    plan: Plan | None,
    options: SmokeOptions,
    endpoint: Endpoint,
    fixes_active: dict[str, str] | None,
    report: SmokeReport,
    ui: ConsoleUI,
) -> tuple[SmokeReport, Fingerprint | None]:
    """The profile's fingerprint check (docs/fingerprints.md) as one more case, and the fingerprint for the
    row (None when none was taken: the profile turns it off, or no key can be made on this machine)."""
    from deploykit.fleet_baseline import check_for_server, fingerprint_case, with_case

    check = check_for_server(
        loaded,
        endpoint,
        store_url=options.store_url,
        store=options.store,
        facts_file=options.facts,
        fixes_active=fixes_active,
        ask_fixes=False,
        plan=plan,
    )
    if check is None:
        return report, None
    profile = loaded.profile
    case, fingerprint = fingerprint_case(check, endpoint, options.model or profile.served_name, readings=2)
    ui.case(case)
    return with_case(report, case), fingerprint
