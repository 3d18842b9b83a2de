"""From a profile and GPU facts: which fixes, why, and the exact `vllm serve` launch (argv + env)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from deploykit import __version__, net
from deploykit.advisories import (
    Advice,
    AdvisoryOutcome,
    ComputeDtype,
    FixCall,
    Verdict,
    advise,
    deployment_facts,
    mode_errors,
    quantization_method,
    resolve_compute_dtype,
)
from deploykit.driver_cuda import driver_warning
from deploykit.fixes import FIX_NAMES as FIX_NAMES  # `--fix NAME=...` checks names against these
from deploykit.fixes import load_fix
from deploykit.fixes.base import OBSOLETE_PREFIX, Decision, DecisionInputs, FixDecision, effective_runner
from deploykit.plugin_contract import FIXES_ENV as FIXES_ENV_VAR
from deploykit.probe.facts import GpuFacts, ProbeFacts
from deploykit.profile.schema import BUILTIN_PREFIX, FixMode, LoadedProfile, Profile, SecretRef
from deploykit.vllm_compat import (
    RUNNER_ENV,
    TESTED_VLLM,
    is_cpu_build,
    runner_choice_problem,
    runner_env_value,
    version_in_range,
)
from deploykit.vllm_tables import NEWEST_KNOWN_RELEASE, env_vars_removed_by, newer_than_known

# Flags the typed settings own; setting them again in extra_args would be ambiguous.
_TYPED_FLAGS = {
    "--served-model-name": "model.served_name",
    "--host": "serve.host",
    "--port": "serve.port",
    "--dtype": "serve.dtype",
    "--max-model-len": "serve.max_model_len",
    "--tensor-parallel-size": "serve.tensor_parallel_size",
    "-tp": "serve.tensor_parallel_size",
    "--gpu-memory-utilization": "serve.gpu_memory_utilization",
    "--enforce-eager": "serve.enforce_eager",
    "--max-num-seqs": "serve.max_num_seqs",
    "--kv-cache-memory-bytes": "serve.kv_cache_memory_bytes",
    "--generation-config": "serve.generation_config",
    "--enable-lora": "serve.lora.enabled",
    "--lora-modules": "serve.lora.adapters",
    "--max-lora-rank": "serve.lora.max_lora_rank",
    "--max-loras": "serve.lora.max_loras",
    "--api-key": "serve.api_key_env",
}


def _owned_flags() -> dict[str, str]:
    """Each flag the profile's typed settings own → that setting; a fix's LAUNCH_FLAGS are `fixes.NAME`'s."""
    fix_flags = {flag: f"fixes.{name}" for name in FIX_NAMES for flag in load_fix(name).LAUNCH_FLAGS}
    return {**_TYPED_FLAGS, **fix_flags}


class ProfileRef(BaseModel):
    name: str
    id: str
    path: str


class RequirementsCheck(BaseModel):
    status: Literal["compatible", "warnings", "incompatible", "unchecked"]
    problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class ArgvValidation(BaseModel):
    status: Literal["ok", "error", "skipped"]
    detail: str


class Plan(BaseModel):
    """The whole decision for one deployment. `env` holds secrets only as `${NAME}` references."""

    model_config = ConfigDict(extra="forbid")

    profile: ProfileRef
    facts: ProbeFacts
    requires: RequirementsCheck
    fixes: list[FixDecision]
    argv: list[str]
    env: dict[str, str]
    secret_env: dict[str, str] = Field(
        default_factory=dict, description="env name → the host variable its value is taken from at launch"
    )
    model_path: str
    vllm_version: str | None = Field(
        description="the vLLM the deployment targets: the profile's vllm_version, else the facts' "
        "(see target_vllm_version); null when neither names one"
    )
    platform: str
    model_runner: str
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
    validation: ArgvValidation = Field(
        default_factory=lambda: ArgvValidation(status="skipped", detail="not run")
    )
    advisories: list[AdvisoryOutcome] = Field(
        default_factory=list,
        description="known-bad combinations that apply (`deploykit advisories`) and what the plan did",
    )
    # Every advisory's verdict with its reasons (`deploykit advisories --profile`); not serialised.
    _verdicts: list[Verdict] = PrivateAttr(default_factory=list)

    @property
    def applied_advisories(self) -> list[str]:
        """Advisories whose workaround (or deploykit fix) is in this launch."""
        return [a.id for a in self.advisories if a.outcome in ("applied", "fixed", "in_place")]

    @property
    def advisory_summary(self) -> list[str]:
        """`id (outcome)` for each advisory that applies: what `profiles list` shows."""
        return [f"{a.id} ({a.outcome})" for a in self.advisories]

    @property
    def verdicts(self) -> list[Verdict]:
        return self._verdicts

    @property
    def enabled_fixes(self) -> list[str]:
        return [f.name for f in self.fixes if f.decision is Decision.ENABLED]

    def shell(self) -> str:
        """One copy-pasteable command; `shlex.split` gives back the env assignments and then the argv."""
        parts = []
        for key, value in self.env.items():
            source = self.secret_env.get(key)
            if source is not None:
                parts.append(f'{key}="${{{source}:?set {source} in the environment}}"')
            else:
                parts.append(f"{key}={shlex.quote(value)}")
        return " ".join([*parts, shlex.join(self.argv)])


def secret_reference(name: str) -> str:
    return f"${{{name}}}"


def resolve_model_path(profile: Profile) -> str:
    """The path vLLM is given: builtin models resolve to their cache directory (built on first serve)."""
    source = profile.model.source
    if source.startswith(BUILTIN_PREFIX):
        from deploykit.tinymodel import tiny_model_dir

        return str(tiny_model_dir())
    return source


def read_local_config(model_path: str) -> dict[str, object]:
    config_path = Path(model_path) / "config.json"
    try:
        data = json.loads(config_path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_facts(profile: Profile, model_path: str) -> tuple[str | None, list[str]]:
    """Checkpoint dtype and architectures: the profile's statement wins, else config.json when local."""
    config = read_local_config(model_path)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    assert isinstance(text_config, dict)
    dtype: str | None = profile.model.checkpoint_dtype
    if dtype is None:
        raw = config.get("torch_dtype") or config.get("dtype") or text_config.get("torch_dtype")
        dtype = str(raw) if raw else None
    if profile.model.source.startswith(BUILTIN_PREFIX) and dtype is None:
        dtype = "float32"
    architectures: list[str]
    if profile.model.architecture:
        architectures = [profile.model.architecture]
    else:
        listed = config.get("architectures")
        architectures = [str(a) for a in listed] if isinstance(listed, list) else []
    return dtype, architectures


def check_requirements(profile: Profile, facts: ProbeFacts) -> RequirementsCheck:
    req = profile.requires
    if profile.platform == "cpu":
        return RequirementsCheck(status="compatible", notes=["CPU profile: GPU requirements do not apply"])
    if not facts.gpus:
        why = facts.error or "no GPU facts"
        return RequirementsCheck(status="unchecked", notes=[f"requirements not checked: {why}"])
    problems: list[str] = []
    notes: list[str] = []
    if len(facts.gpus) < req.gpu_count:
        problems.append(f"needs {req.gpu_count} GPU(s), found {len(facts.gpus)}")
    if profile.serve.tensor_parallel_size > len(facts.gpus):
        problems.append(
            f"tensor_parallel_size {profile.serve.tensor_parallel_size} > {len(facts.gpus)} GPU(s)"
        )
    used = facts.gpus[: max(req.gpu_count, profile.serve.tensor_parallel_size)]
    for gpu in used:
        problems.extend(_gpu_problems(profile, gpu))
    names = sorted({g.name for g in used})
    notes.append(f"checked against {', '.join(names)}")
    if len({g.compute_capability for g in facts.gpus}) > 1:
        return RequirementsCheck(
            status="warnings" if not problems else "incompatible",
            problems=problems,
            notes=[*notes, "GPUs of different compute capability on one host"],
        )
    return RequirementsCheck(
        status="incompatible" if problems else "compatible", problems=problems, notes=notes
    )


def _gpu_problems(profile: Profile, gpu: GpuFacts) -> list[str]:
    req = profile.requires
    problems: list[str] = []
    label = f"GPU {gpu.index} ({gpu.name}, CC {gpu.compute_capability})"
    if req.min_compute_capability:
        wanted = tuple(int(p) for p in req.min_compute_capability.split("."))
        if gpu.compute_capability_tuple < wanted:
            problems.append(f"{label}: compute capability below {req.min_compute_capability}")
    if req.architectures and gpu.arch not in req.architectures:
        problems.append(f"{label}: architecture {gpu.arch} not in {', '.join(req.architectures)}")
    if req.min_memory_mib and gpu.memory_total_mib is not None and gpu.memory_total_mib < req.min_memory_mib:
        problems.append(f"{label}: {gpu.memory_total_mib} MiB < {req.min_memory_mib} MiB")
    return problems


def target_vllm_version(profile: Profile, facts: ProbeFacts) -> str | None:
    """The vLLM version a plan targets (`Plan.vllm_version`), the one fact every version-dependent
    decision reads. First the profile's `vllm_version` (the vLLM the deployment runs, stated), else the
    facts' `vllm_version`: what the probe found installed on the machine it ran on, which is the target
    for `--facts FILE` (a `deploykit probe --save FILE` made there) and this machine for a live probe.
    None when neither names one. The installed vLLM is never read here directly: only through a live
    probe. (`validate_plan` is the exception: it checks the argv with the installed vLLM's parser.)"""
    return profile.vllm_version or facts.vllm_version


def untested_vllm_warning(version: str | None) -> str | None:
    """A warning when the targeted vLLM is not one this deploykit is tested with (TESTED_VLLM), or when
    the target's version is unknown or unreadable; None when it is in the range."""
    verdict = version_in_range(version)
    if verdict:
        return None
    tested = f"this deploykit {__version__} is tested with ({TESTED_VLLM})"
    if verdict is False:
        return (
            f"vLLM {version} is outside the range {tested}; the fixes and launch flags are unproven "
            "there: target a vLLM in the range (the profile's vllm_version, or --facts from a host "
            "running one), or prove this deployment with `deploykit serve --check` on the target"
        )
    what = "unknown (no vllm_version in the profile or the facts)"
    if version:
        what = f"{version!r}, not a version deploykit can compare"
    return (
        f"the target vLLM version is {what}, so it cannot be checked against the range {tested}; "
        "set the profile's vllm_version, or pass --facts from a `deploykit probe --save FILE` on the target"
    )


def unknown_release_warning(version: str | None, decisions: list[FixDecision]) -> str | None:
    """For a target newer than every release deploykit has read (`make vllm-release`): which fixes'
    targets were never checked on it. A fix that stood aside because an older release removed its target
    is not named: nothing newer brings it back unnoticed."""
    if not newer_than_known(version):
        return None
    unchecked = [
        f"{d.name} ({'enabled' if d.decision is Decision.ENABLED else d.decision.value})"
        for d in decisions
        if not d.reason.startswith(OBSOLETE_PREFIX)
    ]
    return (
        f"vLLM {version} is newer than every release deploykit has read (the newest is "
        f"{NEWEST_KNOWN_RELEASE}): the targets of {', '.join(unchecked) or 'no fix'} were never checked "
        "on it; `deploykit fixes` on the target checks them, a mismatch stops vLLM at start-up"
    )


def removed_env_warnings(env: dict[str, str], version: str | None) -> list[str]:
    """A variable the plan writes that the target's vLLM (or, for a newer target, the newest known
    release) no longer defines: it would be ignored, or refused. deploykit's own never are (RUNNER_ENV)."""
    removed = env_vars_removed_by(version)
    return [
        f"env {name}: vLLM {release} no longer reads it (gone from its vllm/envs.py); remove it from the "
        "profile's env"
        for name, release in sorted(removed.items())
        if name in env
    ]


def compute_dtype(
    profile: Profile, facts: ProbeFacts, model_path: str, checkpoint_dtype: str | None, platform: str
) -> ComputeDtype:
    """The dtype the planned engine computes in (deploykit.advisories.compute_dtype): `serve.dtype`, else
    vLLM's `auto` on these GPUs, checked against the quantization method (extra_args, else config.json)."""
    config = read_local_config(model_path)
    if profile.model.checkpoint_dtype:
        source = "model.checkpoint_dtype"
    elif config:
        source = "config.json"
    else:
        source = "no model.checkpoint_dtype and no local config.json"
    model_type = config.get("model_type")
    used = facts.gpus[: max(profile.requires.gpu_count, profile.serve.tensor_parallel_size, 1)]
    return resolve_compute_dtype(
        requested=profile.serve.dtype,
        checkpoint_dtype=checkpoint_dtype,
        checkpoint_source=source,
        gpus=used,
        platform=platform,
        model_type=model_type if isinstance(model_type, str) else None,
        quantization=quantization_method(profile.serve.extra_args, config),
    )


def decision_inputs(profile: Profile, facts: ProbeFacts, model_path: str) -> DecisionInputs:
    dtype, architectures = checkpoint_facts(profile, model_path)
    version = target_vllm_version(profile, facts)
    platform = "cpu" if profile.platform == "cpu" or is_cpu_build(version) else "cuda"
    compute = compute_dtype(profile, facts, model_path, dtype, platform)
    return DecisionInputs(
        gpus=facts.gpus,
        vllm_version=version,
        checkpoint_dtype=dtype,
        model_architectures=architectures,
        lora_enabled=profile.serve.lora.enabled,
        lora_fully_sharded="--fully-sharded-loras" in profile.serve.extra_args,
        penalties_expected=profile.workload.penalties,
        model_runner=profile.serve.model_runner,
        platform=platform,
        compute_dtype=compute.dtype,
        compute_dtype_source=compute.source,
        compute_dtype_refused=compute.refused,
    )


def decide_fixes(
    profile: Profile, inputs: DecisionInputs, overrides: dict[str, FixMode]
) -> list[FixDecision]:
    decisions = []
    for name in FIX_NAMES:
        mode = overrides.get(name, getattr(profile.fixes, name))
        decisions.append(load_fix(name).decide(inputs, mode))
    return decisions


def build_argv(profile: Profile, model_path: str, enabled: list[str], inputs: DecisionInputs) -> list[str]:
    serve = profile.serve
    argv = ["vllm", "serve", model_path, "--served-model-name", profile.served_name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    if serve.dtype != "auto":
        argv += ["--dtype", serve.dtype]
    optional: list[tuple[str, object | None]] = [
        ("--max-model-len", serve.max_model_len),
        ("--gpu-memory-utilization", serve.gpu_memory_utilization),
        ("--max-num-seqs", serve.max_num_seqs),
        ("--kv-cache-memory-bytes", serve.kv_cache_memory_bytes),
        ("--generation-config", serve.generation_config),
    ]
    if serve.tensor_parallel_size != 1:
        optional.append(("--tensor-parallel-size", serve.tensor_parallel_size))
    for flag, value in optional:
        if value is not None:
            argv += [flag, str(value)]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.lora.enabled:
        argv += ["--enable-lora", "--max-lora-rank", str(serve.lora.max_lora_rank)]
        argv += ["--max-loras", str(serve.lora.max_loras)]
        if serve.lora.adapters:
            argv += ["--lora-modules", *(f"{n}={p}" for n, p in serve.lora.adapters.items())]
    for name in enabled:
        argv += load_fix(name).launch_args(inputs)
    argv += serve.extra_args
    return argv


NAN_COUNTER_ENV = "VLLM_COMPUTE_NANS_IN_LOGITS"
"""Makes vLLM count requests with NaN logits (`vllm:corrupted_requests`), which the canary reads."""


def build_env(
    profile: Profile, enabled: list[str], vllm_version: str | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    env: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for key, value in profile.env.items():
        if isinstance(value, SecretRef):
            env[key] = secret_reference(value.secret)
            secrets[key] = value.secret
        else:
            env[key] = value
    if profile.serve.api_key_env:
        # vLLM reads VLLM_API_KEY; the value never appears in argv.
        env["VLLM_API_KEY"] = secret_reference(profile.serve.api_key_env)
        secrets["VLLM_API_KEY"] = profile.serve.api_key_env
    runner_value = runner_env_value(vllm_version, profile.serve.model_runner)
    if runner_value is not None:
        env[RUNNER_ENV] = runner_value
    if profile.serve.count_nan_logits:
        # vLLM counts requests with NaN logits for the canary; a value the profile's env gives wins.
        env.setdefault(NAN_COUNTER_ENV, "1")
    if enabled:
        env[FIXES_ENV_VAR] = ",".join(enabled)
    return env, secrets


def _extra_arg_conflicts(profile: Profile) -> list[str]:
    errors = []
    owned = _owned_flags()
    for arg in profile.serve.extra_args:
        flag = arg.split("=", 1)[0]
        if flag in owned:
            errors.append(f"serve.extra_args sets {flag}; use the profile field `{owned[flag]}` instead")
        if flag in ("--api-key", "--hf-token"):
            errors.append(f"serve.extra_args must not carry {flag}: secrets never go in argv")
    return errors


def unauthenticated_exposure(profile: Profile) -> str | None:
    """Why the profile's server is open to the network without an API key, or None when it is not (or
    the profile states `serve.allow_unauthenticated: true`). A warning in `plan` and `profiles list`;
    `serve` and `render` refuse such a profile."""
    serve = profile.serve
    if serve.api_key_env or serve.allow_unauthenticated or not net.listens_beyond_loopback(serve.host):
        return None
    return (
        f"serve.host is {serve.host} (reachable from other machines) and there is no serve.api_key_env: "
        "anyone who reaches the port can use the model; set `serve.api_key_env: VAR` (the variable holding "
        "the key), or `serve.allow_unauthenticated: true` when something in front authenticates"
    )


def target_mismatch(profile: Profile, facts: ProbeFacts, inputs: DecisionInputs) -> str | None:
    """A CUDA profile planned against facts without a GPU, or for a CPU build of vLLM: the plan would
    quietly drop its fixes and GPU settings, so it stops and asks for the target's facts instead."""
    if profile.platform == "cpu":
        return None
    where = "this machine's probe" if facts.source == "nvml" else f"the saved probe {facts.source}"
    way_out = (
        "pass --facts FILE, a `deploykit probe --save FILE` made on the target GPU host, "
        "or set `platform: cpu` in the profile"
    )
    if not facts.gpus:
        return f"profile {profile.name} is for CUDA, but {where} shows no GPU: {way_out}"
    if inputs.platform == "cpu":
        return (
            f"profile {profile.name} is for CUDA, but the target vLLM {inputs.vllm_version} is a CPU build: "
            f"{way_out}, or set the profile's vllm_version"
        )
    return None


def _disabled_but_called_for(
    profile: Profile, inputs: DecisionInputs, overrides: dict[str, FixMode], decisions: list[FixDecision]
) -> list[str]:
    """A fix turned off (`--fix NAME=off` or the profile) that these facts call for: output may be wrong."""
    warnings = []
    for decision in decisions:
        if decision.mode is not FixMode.OFF:
            continue
        auto = load_fix(decision.name).decide(inputs, FixMode.AUTO)
        if auto.decision is Decision.ENABLED:
            source = f"--fix {decision.name}=off" if decision.name in overrides else "the profile"
            warnings.append(
                f"fix {decision.name} is turned off by {source}, but these facts call for it "
                f"({auto.reason}): the server's output may be wrong"
            )
    return warnings


def _plugins_exclude_deploykit(profile: Profile, enabled: list[str]) -> str | None:
    """vLLM loads only the plugins VLLM_PLUGINS names, when it is set: one that leaves deploykit's out
    while a fix is on would serve without the fix, silently."""
    from deploykit.plugin_contract import ENTRY_POINT_NAME

    value = profile.env.get("VLLM_PLUGINS")
    if not enabled or not isinstance(value, str):
        return None
    if ENTRY_POINT_NAME in [name.strip() for name in value.split(",")]:
        return None
    return (
        f"env VLLM_PLUGINS={value!r} leaves out deploykit's plugin, so vLLM would run without the planned "
        f"fixes ({', '.join(enabled)}): add {ENTRY_POINT_NAME} to it, or remove VLLM_PLUGINS from the profile"
    )


def make_plan(
    loaded: LoadedProfile,
    facts: ProbeFacts,
    overrides: dict[str, FixMode] | None = None,
) -> Plan:
    profile = loaded.profile
    model_path = resolve_model_path(profile)
    inputs = decision_inputs(profile, facts, model_path)
    decisions = decide_fixes(profile, inputs, overrides or {})
    enabled = [d.name for d in decisions if d.decision is Decision.ENABLED]
    errors = _extra_arg_conflicts(profile)
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
    unknown = unknown_release_warning(inputs.vllm_version, decisions)
    if unknown:
        warnings.append(unknown)
    warnings += _disabled_but_called_for(profile, inputs, overrides or {}, decisions)
    exposure = unauthenticated_exposure(profile)
    if exposure:
        warnings.append(exposure)
    plugins = _plugins_exclude_deploykit(profile, enabled)
    if plugins:
        warnings.append(plugins)
    for decision in decisions:
        if decision.decision is Decision.IMPOSSIBLE:
            if decision.mode is FixMode.ON:
                errors.append(f"fix {decision.name} is forced on but cannot apply: {decision.reason}")
            else:
                warnings.append(f"fix {decision.name}: {decision.reason}")
    requires = check_requirements(profile, facts)
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
    env, secrets = build_env(profile, enabled, inputs.vllm_version)
    warnings += removed_env_warnings(env, inputs.vllm_version)
    argv = build_argv(profile, model_path, enabled, inputs)
    advice = plan_advice(profile, facts, inputs, (argv, env), decisions, runner)
    plan = Plan(
        profile=ProfileRef(name=profile.name, id=loaded.id, path=str(loaded.path)),
        facts=facts,
        requires=requires,
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


def plan_advice(
    profile: Profile,
    facts: ProbeFacts,
    inputs: DecisionInputs,
    launch: tuple[list[str], dict[str, str]],
    decisions: list[FixDecision],
    runner: str,
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
        gpu_count=profile.requires.gpu_count,
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
    )
    advice = advise(deployment, argv, env, profile.advisories, calls)
    advice.errors += mode_errors(profile.advisories)
    return advice


def validate_plan(plan: Plan, cache_dir: Path | None = None) -> None:
    """Check the argv as the parser of the vLLM the plan targets would, without importing vLLM; record
    the outcome. Against that release's shipped option table (deploykit.vllm_options; a few milliseconds),
    or, for an installed vLLM without one, its parser read once in a child process and cached.
    """
    from deploykit.vllm_args import ArgvRejected
    from deploykit.vllm_options import NEWEST_TABLE_HOW, OptionTableUnavailable, check_serve_argv

    try:
        verdict = check_serve_argv(plan.argv, cache_dir, vllm_version=plan.vllm_version)
    except ArgvRejected as exc:
        plan.validation = ArgvValidation(status="error", detail=str(exc))
        plan.errors.append(f"vLLM's own parser rejects the launch: {exc}")
        return
    except OptionTableUnavailable as exc:
        plan.validation = ArgvValidation(status="skipped", detail=f"argv not validated: {exc}")
        return
    plan.validation = ArgvValidation(status="ok", detail=verdict.describe())
    if verdict.how.startswith(NEWEST_TABLE_HOW):
        plan.warnings.append(
            f"the argv was checked against the option table of vLLM {verdict.vllm_version}, the newest "
            f"deploykit ships, not against vLLM {plan.vllm_version}'s own parser: an option that release "
            "added, removed or changed is not known here (`make vllm-release VERSION=...` adds its table)"
        )
        return
    mismatch = validated_elsewhere_warning(plan.vllm_version, verdict.vllm_version)
    if mismatch:
        plan.warnings.append(mismatch)


def validated_elsewhere_warning(target: str | None, validated: str | None) -> str | None:
    """The argv is checked with the installed vLLM's parser; say so when the plan targets another release
    (local labels such as +cpu aside), since the chart's image runs the targeted one."""
    from deploykit.vllm_compat import same_release

    if not target or not validated or same_release(target, validated):
        return None
    return (
        f"the argv was validated with the installed vLLM {validated}'s parser, not with the vLLM {target} "
        "the plan targets: check it there (`deploykit plan` on a host running it)"
    )
