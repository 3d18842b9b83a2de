"""From a profile and GPU facts: which fixes, why, and the exact `vllm serve` launch (argv + env).

`make_plan` is the whole decision; its parts are modules of their own: what a plan is (model.py), what it
decides from (inputs.py), the GPUs its ranks use (layout.py), the profile's GPU requirements
(requirements.py), the launch it writes and the flags the profile owns (launch.py), what it warns of or
refuses (findings.py), and the argv checked by the target vLLM's parser (validate.py). What other packages
use is named here.
"""

from __future__ import annotations

from deploykit.advisories import Advice, ComputeDtype, FixCall, advise, deployment_facts, mode_errors
from deploykit.driver_cuda import driver_warning
from deploykit.fixes import FIX_NAMES as FIX_NAMES  # `--fix NAME=...` checks names against these
from deploykit.fixes import load_fix
from deploykit.fixes.base import Decision, DecisionInputs, FixDecision, effective_runner
from deploykit.plan.findings import (
    disabled_but_called_for,
    installed_vllm_mismatch,
    installed_vllm_warning,
    plugins_exclude_deploykit,
    removed_env_warnings,
    removed_name_errors,
    target_mismatch,
    unknown_release_warning,
    untested_vllm_warning,
)
from deploykit.plan.findings import unauthenticated_exposure as unauthenticated_exposure
from deploykit.plan.inputs import checkpoint_facts as checkpoint_facts
from deploykit.plan.inputs import decision_inputs, read_local_config, resolve_model_path
from deploykit.plan.inputs import target_vllm_version as target_vllm_version
from deploykit.plan.launch import NAN_COUNTER_ENV as NAN_COUNTER_ENV
from deploykit.plan.launch import build_argv, build_env, extra_arg_conflicts, usage_stats_conflicts
from deploykit.plan.launch import hub_sources as hub_sources
from deploykit.plan.launch import owned_flags as owned_flags
from deploykit.plan.layout import ParallelLayout as ParallelLayout
from deploykit.plan.layout import fit_problem, parallel_layout
from deploykit.plan.layout import multi_node_refusal as multi_node_refusal
from deploykit.plan.model import Plan, ProfileRef
from deploykit.plan.requirements import check_requirements
from deploykit.plan.validate import validate_plan as validate_plan
from deploykit.plan.validate import validated_elsewhere_warning as validated_elsewhere_warning
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.revisions import revision_warnings
from deploykit.profile.schema import FixMode, LoadedProfile, Profile
from deploykit.vllm_compat import is_cpu_build, runner_choice_problem

__all__ = [
    "FIX_NAMES",
    "NAN_COUNTER_ENV",
    "ParallelLayout",
    "Plan",
    "build_env",
    "checkpoint_facts",
    "host_vllm_mismatch",
    "host_vllm_warning",
    "hub_sources",
    "make_plan",
    "multi_node_refusal",
    "owned_flags",
    "resolve_model_path",
    "target_vllm_version",
    "unauthenticated_exposure",
    "validate_plan",
    "validated_elsewhere_warning",
]


def decide_fixes(
    profile: Profile, inputs: DecisionInputs, overrides: dict[str, FixMode]
) -> list[FixDecision]:
    decisions = []
    for name in FIX_NAMES:
        mode = overrides.get(name, profile.fixes.mode(name))
        decisions.append(load_fix(name).decide(inputs, mode))
    return decisions


def make_plan(
    loaded: LoadedProfile,
    facts: ProbeFacts,
    overrides: dict[str, FixMode] | None = None,
) -> Plan:
    profile = loaded.profile
    model_path = resolve_model_path(profile)
    layout, layout_errors = parallel_layout(profile)
    inputs = decision_inputs(profile, facts, model_path, layout)
    decisions = decide_fixes(profile, inputs, overrides or {})
    enabled = [d.name for d in decisions if d.decision is Decision.ENABLED]
    errors = extra_arg_conflicts(profile) + layout_errors + usage_stats_conflicts(profile)
    if misfit := fit_problem(layout, facts, inputs.platform):
        errors.append(misfit)
    mismatch = target_mismatch(profile, facts, inputs)
    if mismatch:
        errors.insert(0, mismatch)
    runner_problem = runner_choice_problem(inputs.vllm_version, profile.serve.model_runner)
    if runner_problem:
        errors.insert(0, runner_problem)
    warnings: list[str] = []
    untested = untested_vllm_warning(inputs.vllm_version)
    if untested:
        warnings.append(untested)
    installed = installed_vllm_warning(profile.vllm_version, facts)
    if installed:
        warnings.append(installed)
    unknown = unknown_release_warning(inputs.vllm_version, decisions)
    if unknown:
        warnings.append(unknown)
    warnings += disabled_but_called_for(profile, inputs, overrides or {}, decisions)
    exposure = unauthenticated_exposure(profile)
    if exposure:
        warnings.append(exposure)
    plugins = plugins_exclude_deploykit(profile, enabled)
    if plugins:
        warnings.append(plugins)
    for decision in decisions:
        if decision.decision is Decision.IMPOSSIBLE:
            if decision.mode is FixMode.ON:
                errors.append(f"fix {decision.name} is forced on but cannot apply: {decision.reason}")
            else:
                warnings.append(f"fix {decision.name}: {decision.reason}")
    requires = check_requirements(profile, facts, layout)
    if requires.status == "incompatible":
        warnings.extend(f"requires: {p}" for p in requires.problems)
    if requires.status == "unchecked":
        warnings.extend(requires.notes)
    if driver := driver_warning(facts, inputs.vllm_version, profile.platform):
        warnings.append(driver)
    if facts.gpus and is_cpu_build(inputs.vllm_version):
        warnings.append(
            f"the facts show {len(facts.gpus)} GPU(s) but the target vLLM {inputs.vllm_version} is a CPU "
            "build: the GPUs would go unused; plan with the facts of a host that runs a CUDA vLLM"
        )
    runner = effective_runner(inputs)
    for decision in decisions:
        warnings += load_fix(decision.name).plan_warnings(inputs, decision)
    env, secrets = build_env(profile, enabled, inputs.vllm_version, model_path)
    errors += removed_name_errors(loaded, inputs.vllm_version)
    warnings += removed_env_warnings(env, inputs.vllm_version, given=profile.env)
    warnings += revision_warnings(loaded)
    argv = build_argv(profile, model_path, enabled, inputs)
    advice = plan_advice(profile, facts, inputs, (argv, env), decisions, runner, layout)
    plan = Plan(
        profile=ProfileRef(name=profile.name, id=loaded.id, path=str(loaded.path)),
        facts=facts,
        requires=requires,
        layout=layout,
        fixes=decisions,
        argv=advice.argv,
        env=advice.env,
        secret_env=secrets,
        model_path=model_path,
        vllm_version=inputs.vllm_version,
        platform=inputs.platform,
        model_runner=runner,
        warnings=[*warnings, *advice.warnings],
        errors=[*errors, *advice.errors],
        advisories=advice.outcomes,
    )
    plan._verdicts = advice.verdicts
    return plan


def host_vllm_mismatch(plan: Plan) -> str | None:
    """The plan's vLLM against the one its facts' host has installed (findings.installed_vllm_mismatch):
    what `deploykit serve` refuses on, naming both; None when they are one release."""
    return installed_vllm_mismatch(plan.vllm_version, plan.facts)


def host_vllm_warning(plan: Plan) -> str | None:
    """The warning `make_plan` gave for that mismatch: a host's, which a chart (the profile's image) drops."""
    return installed_vllm_warning(plan.vllm_version, plan.facts)


def plan_advice(
    profile: Profile,
    facts: ProbeFacts,
    inputs: DecisionInputs,
    launch: tuple[list[str], dict[str, str]],
    decisions: list[FixDecision],
    runner: str,
    layout: ParallelLayout,
) -> Advice:
    """The advisories (deploykit.advisories) judged on this launch's argv and env, and acted on."""
    argv, env = launch
    calls = {}
    for decision in decisions:
        auto = load_fix(decision.name).decide(inputs, FixMode.AUTO)
        enabled = decision.decision is Decision.ENABLED
        calls[decision.name] = FixCall(
            called_for=auto.decision is Decision.ENABLED, reason=auto.reason, enabled=enabled
        )
    deployment = deployment_facts(
        facts,
        argv=argv,
        env=env,
        vllm_version=inputs.vllm_version,
        platform=inputs.platform,
        gpu_count=layout.gpu_request,
        architectures=inputs.model_architectures,
        checkpoint_dtype=inputs.checkpoint_dtype,
        compute=ComputeDtype(
            dtype=inputs.compute_dtype,
            source=inputs.compute_dtype_source,
            refused=inputs.compute_dtype_refused,
        ),
        model_config=read_local_config(argv[2]) if len(argv) > 2 else {},
        penalties=profile.workload.penalties,
        model_runner=runner,
        nodes=layout.nodes,
        data_parallel=layout.data_parallel,
        gpus_per_node=layout.gpus_per_node,
    )
    advice = advise(deployment, argv, env, profile.advisories, calls)
    advice.errors += mode_errors(profile.advisories)
    return advice
