"""What a plan warns of or refuses besides the fixes' own decisions: an untested or unknown vLLM, a pinned
vLLM the host does not have installed, variables and options the target vLLM removed, a server open without a
key, a target the facts do not match, a fix turned off that the facts call for, a VLLM_PLUGINS that leaves
deploykit out."""

from __future__ import annotations

from collections.abc import Collection

from deploykit import __version__, net
from deploykit.fixes import load_fix
from deploykit.fixes.base import OBSOLETE_PREFIX, Decision, DecisionInputs, FixDecision
from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import located
from deploykit.profile.schema import FixMode, LoadedProfile, Profile
from deploykit.vllm_compat import (
    TESTED_VLLM,
    same_release,
    version_in_range,
)
from deploykit.vllm_removed import Removal, env_removal, option_removal
from deploykit.vllm_tables import NEWEST_KNOWN_RELEASE, newer_than_known


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


def removed_name_errors(loaded: LoadedProfile, version: str | None) -> list[str]:
    """A variable in the profile's `env` or an option in its `serve.extra_args` that the target vLLM's release
    or an earlier one removed (deploykit.vllm_removed: the shipped tables, and the history before them): vLLM
    would ignore the variable, or refuse the option at start-up. One located line each (`FILE:LINE:COL:
    env.NAME: ...`), naming the release that removed it and what replaces it. None for an unknown target."""
    profile = loaded.profile
    errors = []
    for name in profile.env:
        removal = env_removal(name, version)
        if removal is not None:
            message = f"vLLM {version} no longer reads {name}: {removal.explained()}"
            errors.append(located(loaded, ("env", name), f"{message}{_or_older(removal)}"))
    for index, word in enumerate(profile.serve.extra_args):
        removal = option_removal(word, version)
        if removal is not None:
            message = f"{word}: vLLM {version} has no {removal.name} option: {removal.explained()}"
            errors.append(located(loaded, ("serve", "extra_args", index), f"{message}{_or_older(removal)}"))
    return errors


def _or_older(removal: Removal) -> str:
    return f", or target a vLLM before {removal.release} (the profile's vllm_version)"


def removed_env_warnings(env: dict[str, str], version: str | None, given: Collection[str]) -> list[str]:
    """A variable deploykit itself writes into the plan (none of the profile's `env`, refused by
    `removed_name_errors`) that the target vLLM no longer reads: deploykit's own mistake, said rather than
    refused. RUNNER_ENV never is: it is written only for a release that still reads it."""
    warnings = []
    for name in sorted(set(env) - set(given)):
        removal = env_removal(name, version)
        if removal is not None:
            warnings.append(
                f"env {name}: deploykit writes it, but vLLM {version} no longer reads it (vLLM "
                f"{removal.release} removed it, {removal.source}): a deploykit bug, please report it"
            )
    return warnings


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


def installed_vllm_mismatch(target: str | None, facts: ProbeFacts) -> str | None:
    """The target (a profile's pinned `vllm_version`) against the vLLM the facts' host has installed, by
    release (`0.32.0+cpu` is 0.32.0): why they differ, naming both, or None (the same release, or nothing to
    compare). A plan targets the facts' vLLM unless the profile pins one, so only a pin can differ."""
    installed = facts.vllm_version
    if not target or not installed or same_release(target, installed):
        return None
    where = "this machine's probe" if facts.source == "nvml" else f"the saved probe {facts.source}"
    return f"the profile's vllm_version is {target}, but {where} shows vLLM {installed} installed"


def installed_vllm_warning(target: str | None, facts: ProbeFacts) -> str | None:
    """`installed_vllm_mismatch` as a plan's warning: what it means on that host, and the ways out."""
    mismatch = installed_vllm_mismatch(target, facts)
    if mismatch is None:
        return None
    return (
        f"{mismatch}: this plan is for {target}, so `deploykit serve` and the rendered systemd unit refuse "
        f"to start there; install vLLM {target} on that host, or change the profile's vllm_version "
        "(a Helm chart runs the profile's release: its image)"
    )


def disabled_but_called_for(
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


def plugins_exclude_deploykit(profile: Profile, enabled: list[str]) -> str | None:
    """vLLM loads only the plugins VLLM_PLUGINS names, when it is set: one that leaves deploykit's out
    while a fix is on would serve without the fix, silently."""
    from deploykit.plugin_contract import ENTRY_POINT_NAME, PLUGINS_ENV

    value = profile.env.get(PLUGINS_ENV)
    if not enabled or not isinstance(value, str):
        return None
    if ENTRY_POINT_NAME in [name.strip() for name in value.split(",")]:
        return None
    return (
        f"env VLLM_PLUGINS={value!r} leaves out deploykit's plugin, so vLLM would run without the planned "
        f"fixes ({', '.join(enabled)}): add {ENTRY_POINT_NAME} to it, or remove VLLM_PLUGINS from the profile"
    )
