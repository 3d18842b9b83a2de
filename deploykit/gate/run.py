"""The whole gate: the baseline side (a running server, one deploykit starts, or the store's), the candidate
(a running server or one deploykit starts), the load sample on whatever is live, the verdict, one row, and
`--adopt`. A side deploykit started is stopped whatever happens; a row is stored whatever happens.

Adoption follows the store's rule for baselines (docs/fingerprints.md): a gate's row moves no baseline of its
own accord, a row replayed from the spool included; only this process's explicit pin, after its row is
stored, makes the candidate its key's baseline, and the baseline it replaces stays readable for a rollback.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from deploykit import __version__, net
from deploykit.endpoint import Endpoint
from deploykit.errors import DeploykitError, UsageError
from deploykit.gate import judge, measure
from deploykit.gate.model import Figures, GateReport, LoadPoint, Side
from deploykit.serve.helpers import redact

if TYPE_CHECKING:
    from deploykit.gate.launch import Launched
    from deploykit.plan import Plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.schema import GateSpec, LoadedProfile, Profile
    from deploykit.results.record import ResultRecord
    from deploykit.results.store import Store

LOAD_ROUNDS = 4
"""Each stream count is sampled this many times per side (alternating sides when both are live); the best
and the worst are kept (`load_sample.best`). A candidate is slower only outside the baseline's spread: with
the sides alternating, noise alone puts all four of one side's samples below all four of the other's once in
C(8, 4) = 70 comparisons, before the threshold."""


class GateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    profile: str
    url: str | None = None
    launch: bool = False
    candidate_profile: str | None = None
    candidate_python: str | None = None
    baseline_url: str | None = None
    launch_baseline: bool = False
    baseline_python: str | None = None
    baseline_row: int | None = None
    facts: str | None = None
    api_key_env: str | None = None
    store_url: str | None = None
    store: bool = True
    load: bool = True
    adopt: bool = False
    accept_drift: bool = False
    log_dir: str | None = None


def check_options(options: GateOptions) -> None:
    """Contradictions refused before any work, each in one line."""
    if (options.url is None) == (not options.launch):
        raise UsageError(
            "gate: give the candidate: --url URL (a running server) or --launch (deploykit starts it)"
        )
    if not options.launch and options.candidate_python:
        raise UsageError("gate: --candidate-python is the environment of a candidate to --launch")
    baselines = [options.baseline_url is not None, options.launch_baseline, options.baseline_row is not None]
    if sum(baselines) > 1:
        raise UsageError(
            "gate: give at most one baseline: --baseline-url, --launch-baseline or --baseline-row"
        )
    if options.baseline_python and not options.launch_baseline:
        raise UsageError("gate: --baseline-python describes a baseline to --launch-baseline")
    live_baseline = options.baseline_url is not None or options.launch_baseline
    if not live_baseline and not options.store:
        raise UsageError(
            "gate: without a store the baseline must be a server: pass --baseline-url URL or "
            "--launch-baseline"
        )
    if options.adopt and not options.store:
        raise UsageError(
            "gate: --adopt makes the candidate a baseline in the store: it needs one (not --no-store)"
        )
    if options.accept_drift and not options.adopt:
        raise UsageError(
            "gate: --accept-drift is a person's word that a drifted candidate becomes the baseline: "
            "give it with --adopt"
        )
    for flag, url in (("--url", options.url), ("--baseline-url", options.baseline_url)):
        if url is not None and (problem := net.server_url_problem(url)):
            raise UsageError(f"gate: {flag} {net.redact_url(url)!r}: {problem}")
    if (
        options.launch
        and options.candidate_profile is None
        and options.candidate_python is None
        and (options.launch_baseline and options.baseline_python is None)
    ):
        raise UsageError(
            "gate: the launched candidate would be the launched baseline itself: give "
            "--candidate-profile or --candidate-python (or --baseline-python)"
        )


def run_gate(options: GateOptions, print_line: Callable[[str], None]) -> GateReport:
    """The gate's verdict, its row stored (or spooled) and, when asked and allowed, the candidate adopted."""
    from deploykit.results.record import ResultRecord
    from deploykit.results.stores import open_store
    from deploykit.serve.stages import load

    check_options(options)
    started = time.monotonic()
    secrets = _secrets(options)

    def say(line: str) -> None:  # a progress line may quote a server, which may echo what it was sent
        print_line(redact(line, secrets))

    loaded = load(options.profile)
    candidate_loaded = load(options.candidate_profile) if options.candidate_profile else loaded
    store = open_store(options.store_url, warn=say) if options.store else None
    record = ResultRecord(command="gate", verdict="error", stage="plan", base_url=options.url)
    record.profile_name, record.profile_id = loaded.profile.name, loaded.id
    record.versions = {"deploykit": __version__}
    report: GateReport | None = None
    try:
        report = _judged(options, loaded, candidate_loaded, store, record, say)
        record.stage, record.verdict = "done", "pass" if report.verdict == "promote" else "fail"
        record.diagnosis = f"{report.label}: {report.summary}"
    except DeploykitError as exc:
        record.diagnosis = exc.message
        raise
    finally:
        record.timings["total_s"] = round(time.monotonic() - started, 4)
        if report is not None:
            report.elapsed_s = record.timings["total_s"] or 0.0
            report = GateReport.model_validate_json(redact(report.model_dump_json(), secrets))
            record.gate = report.model_dump(mode="json")
        record = ResultRecord.model_validate_json(redact(record.model_dump_json(), secrets))
        if store is not None:
            try:
                _store_and_adopt(record, report, store, options.adopt, say)
            finally:
                store.close()
    assert report is not None  # an exception above propagates, its row stored
    return report


def _secrets(options: GateOptions) -> list[str]:
    """Every value that must never reach the row, the report or the screen: the environment's secrets (the
    servers' API key among them) and the key `--api-key-env` names, whatever its name. A hostile server may
    echo what it was sent."""
    from deploykit.serve.helpers import secret_values

    found = secret_values(None, os.environ)
    named = os.environ.get(options.api_key_env or "")
    return sorted({*found, named} if named else set(found), key=len, reverse=True)


def _store_and_adopt(
    record: ResultRecord, report: GateReport | None, store: Store, adopt: bool, say: Callable[[str], None]
) -> None:
    from deploykit.results.store_row import store_row

    row_id, where = store_row(record, store, say, what="the gate's row")
    if row_id is None:
        if report is not None and adopt:
            say("not adopted: the gate's row is not in the store yet (a spooled row never moves a baseline)")
        return
    say(f"row #{row_id} stored in {where}")
    if report is not None:
        report.row_id = row_id
        if adopt:
            _adopt(report, store, say)


def _adopt(report: GateReport, store: Store, say: Callable[[str], None]) -> None:
    """The candidate's fingerprint pinned as its key's baseline, when the verdict allows it: a promote, or a
    drift a person accepted (`--accept-drift`) while everything else held. Never a broken or slower one."""
    assert report.row_id is not None
    allowed = report.verdict == "promote" and (report.drift is None or report.accepted_drift)
    if not allowed:
        say(f"not adopted: the verdict is {report.label}")
        return
    why = "drift accepted by --accept-drift: " + report.drift.text if report.drift else "promoted"
    baseline = store.pin_baseline(report.row_id, note=f"adopted by deploykit gate ({why})"[:500])
    report.adopted_baseline = baseline.id
    say(
        f"adopted: baseline #{baseline.id} of key {baseline.key[:12]} is row #{report.row_id}; the one it "
        "replaces stays readable (`deploykit results baseline show --all`)"
    )


def _facts(options: GateOptions) -> ProbeFacts:
    from deploykit.probe.load import load_facts, probe

    return load_facts(options.facts) if options.facts else probe()


def _key_for(
    profile: Profile, plan: Plan
) -> Callable[[dict[str, str] | None, str | None], tuple[dict[str, Any], str]]:
    """A side's key: its profile's plan, the fixes its server reports, the vLLM release it reports."""
    from deploykit.fleet_baseline import key_parts_for_plan

    def key_for(fixes_active: dict[str, str] | None, version: str | None) -> tuple[dict[str, Any], str]:
        parts, dtype = key_parts_for_plan(profile, plan, fixes_active, profile.smoke.fingerprint.top_k)
        parts["vllm"] = release_part(str(parts["vllm"]), version)
        return parts, dtype

    return key_for


def release_part(planned: str, reported: str | None) -> str:
    """The key's vLLM release: the plan's spelling (what `serve` and the canary key by, e.g. `0.32.0+cpu`)
    when the server reports the same release (`/version` drops the local label), else what the server
    reports: a candidate of another release than the plan expected is keyed by the one it runs."""
    from deploykit.vllm_compat import same_release

    if reported is None or same_release(planned, reported):
        return planned
    return reported


def _endpoint(profile: Profile, url: str, api_key_env: str | None) -> Endpoint:
    from deploykit.serve.stages import profile_endpoint

    if api_key_env is None:
        return profile_endpoint(profile, url)
    key = net.secret_from_env(api_key_env, os.environ)
    return Endpoint(url, api_key=key, request_deadline_s=profile.smoke.timeout_s)


def _judged(
    options: GateOptions,
    loaded: LoadedProfile,
    candidate_loaded: LoadedProfile,
    store: Store | None,
    record: ResultRecord,
    say: Callable[[str], None],
) -> GateReport:
    from deploykit.fleet_baseline import key_digest, key_parts_for_plan
    from deploykit.gate.baseline import stored_side
    from deploykit.plan import make_plan
    from deploykit.serve.stages import check_plan

    profile, spec = loaded.profile, loaded.profile.gate
    facts = _facts(options)
    record.facts = facts.model_dump(mode="json")
    plan = make_plan(loaded, facts)
    check_plan(plan)
    candidate_plan = plan if candidate_loaded is loaded else make_plan(candidate_loaded, facts)
    check_plan(candidate_plan)
    log_dir = Path(options.log_dir) if options.log_dir else None  # the default only when a side launches
    record.stage = "baseline"

    # The baseline first: a stored one is found before any server starts (a missing one is a usage error).
    stored: Side | None = None
    if options.baseline_url is None and not options.launch_baseline:
        assert store is not None
        parts, _ = key_parts_for_plan(profile, plan, None, profile.smoke.fingerprint.top_k)
        stored = stored_side(store, key_digest(parts), parts, options.baseline_row)
        if options.load and stored.figures is None:
            raise UsageError(
                f"gate: {stored.source} has answers but no speed figures (only a gate's adopted candidate "
                "stores them): pass --baseline-url URL or --launch-baseline to measure one, or --no-load to "
                "judge answers only"
            )
        say(f"baseline: {stored.source}, vLLM {stored.vllm_version}")

    launched: list[Launched] = []
    try:
        baseline, baseline_endpoint = _baseline_side(
            options, loaded, plan, facts, stored, log_dir, launched, say
        )
        record.stage = "candidate"
        if options.launch_baseline and launched:
            launched.pop().stop()  # measured already: the candidate gets the machine to itself
        candidate, candidate_endpoint = _candidate_side(
            options, candidate_loaded, candidate_plan, facts, log_dir, launched, say
        )
        record.base_url = candidate.url
        record.cases, record.fixes_active = list(candidate.cases), candidate.fixes_active
        record.fingerprint = candidate.fingerprint
        record.versions.update(
            {"vllm_candidate": candidate.vllm_version, "vllm_baseline": baseline.vllm_version}
        )
        record.stage = "load"
        if options.load and not judge.broken_reason(candidate):
            live = (
                [(baseline, baseline_endpoint, profile.served_name)] if baseline_endpoint is not None else []
            )
            live.append((candidate, candidate_endpoint, candidate_loaded.profile.served_name))
            _load_rounds(live, spec, say)
    finally:
        for side in launched:
            side.stop()

    drift, tolerance, clear = None, None, None
    if baseline.fingerprint is not None and candidate.fingerprint is not None:
        drift, tolerance = judge.drift_between(baseline.fingerprint, candidate.fingerprint)
        clear = judge.clear_positions(baseline.fingerprint, tolerance)
    speed = []
    if options.load and baseline.figures is not None and candidate.figures is not None:
        speed = judge.speed_findings(baseline.figures, candidate.figures, spec.slower_threshold)
    reason, summary = judge.verdict(baseline, candidate, drift, speed, clear)
    accepted = options.accept_drift and judge.drift_acceptable(reason, candidate, speed)
    if options.accept_drift and reason == "drift" and not accepted:
        summary += "; --accept-drift cannot adopt it: " + judge.why_not_acceptable(candidate, speed)
    if accepted:
        reason, summary = None, f"drift accepted by a person (--accept-drift): {summary}"
    return GateReport(
        verdict="promote" if reason is None else "hold",
        reason=reason,
        summary=summary,
        profile=profile.name,
        baseline=baseline,
        candidate=candidate,
        changed=judge.changed_parts(baseline, candidate),
        drift=drift,
        fingerprint_tolerance=tolerance,
        fingerprint_clear=list(clear) if clear is not None else None,
        speed=speed,
        speed_judged=any(f.judged for f in speed),
        slower_threshold=spec.slower_threshold,
        accepted_drift=accepted,
    )


def _baseline_side(
    options: GateOptions,
    loaded: LoadedProfile,
    plan: Plan,
    facts: ProbeFacts,
    stored: Side | None,
    log_dir: Path | None,
    launched: list[Launched],
    say: Callable[[str], None],
) -> tuple[Side, Endpoint | None]:
    if stored is not None:
        return stored, None
    profile = loaded.profile
    if options.launch_baseline:
        from deploykit.gate.launch import launch  # here: a pod gates running servers and has no launch module

        python = Path(options.baseline_python) if options.baseline_python else None
        started = launch(loaded, facts, python=python, log_dir=_log_dir(log_dir), say=say)
        launched.append(started)
        side = _measure(
            "baseline", "launched", loaded, started.plan, started.endpoint, say, started.startup_s
        )
        if options.load and not judge.broken_reason(side):
            _load_rounds([(side, started.endpoint, profile.served_name)], profile.gate, say)
        return side, None
    assert options.baseline_url is not None
    endpoint = _endpoint(profile, options.baseline_url, options.api_key_env)
    return _measure("baseline", "url", loaded, plan, endpoint, say, None), endpoint


def _candidate_side(
    options: GateOptions,
    loaded: LoadedProfile,
    plan: Plan,
    facts: ProbeFacts,
    log_dir: Path | None,
    launched: list[Launched],
    say: Callable[[str], None],
) -> tuple[Side, Endpoint]:
    if options.url is not None:
        endpoint = _endpoint(loaded.profile, options.url, options.api_key_env)
        return _measure("candidate", "url", loaded, plan, endpoint, say, None), endpoint
    from deploykit.gate.launch import launch
    from deploykit.serve.driver import StageFailure

    python = Path(options.candidate_python) if options.candidate_python else None
    try:
        started = launch(loaded, facts, python=python, log_dir=_log_dir(log_dir), say=say)
    except StageFailure as exc:  # a candidate that cannot start is broken, and the row says why
        side = Side(role="candidate", source="launched", problem=f"it did not start: {exc.message}")
        return side, Endpoint("http://127.0.0.1:9")  # never read: a broken side takes no load sample
    launched.append(started)
    side = _measure("candidate", "launched", loaded, started.plan, started.endpoint, say, started.startup_s)
    return side, started.endpoint


def _log_dir(given: Path | None) -> Path:
    from deploykit.paths import default_log_dir

    return given if given is not None else default_log_dir()


def _measure(
    role: str,
    source: str,
    loaded: LoadedProfile,
    plan: Plan,
    endpoint: Endpoint,
    say: Callable[[str], None],
    startup_s: float | None,
) -> Side:
    say(f"{role}: {source} {endpoint.shown}: smoke, known answers, fix check, fingerprint ×2")
    side = measure.measure_answers(
        role,  # type: ignore[arg-type]
        source,
        loaded.profile,
        plan,
        endpoint,
        expected_fixes=plan.enabled_fixes,
        key_for=_key_for(loaded.profile, plan),
    )
    side.figures = measure.figures(endpoint, startup_s)
    say(
        f"{role}: vLLM {side.vllm_version}, {len(side.failed_cases)} failed case(s)"
        + (f", {side.problem}" if side.problem else "")
    )
    return side


def _load_rounds(
    live: Sequence[tuple[Side, Endpoint, str]], spec: GateSpec, say: Callable[[str], None]
) -> None:
    """The load sample on each live side: every stream count `LOAD_ROUNDS` times, the sides alternating, the
    best kept. Each side warms up first (its first requests pay for compilation)."""
    from deploykit.gate.load_sample import best

    for _, endpoint, served in live:
        measure.warm_up(endpoint, served, spec)
    samples: dict[tuple[int, int], list[LoadPoint]] = {}
    salt = 0
    for _ in range(LOAD_ROUNDS):
        for streams in spec.streams:
            for index, (_, endpoint, served) in enumerate(live):
                salt += 1
                samples.setdefault((index, streams), []).append(
                    measure.load_point(endpoint, served, spec, streams, salt)
                )
    for index, (side, _, _) in enumerate(live):
        points = [best(samples[(index, streams)]) for streams in spec.streams]
        side.figures = (side.figures or Figures()).model_copy(update={"load": points})
        shown = ", ".join(f"{p.streams}: {p.tokens_per_s:g} tok/s" for p in points)
        say(f"{side.role}: load {shown}")
