"""Which advisories apply to a deployment, why each does or does not, and what the plan does about it.

`judge` is pure: an advisory and the deployment's facts in, a verdict with one line per condition out.
`advise` turns the verdicts for one plan into outcomes (applied, warned, ignored, fixed) and the argv and
environment with the applied workarounds in them.
"""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from deploykit import argv as argv_reader
from deploykit.advisories.catalog import advisories as catalog_advisories
from deploykit.advisories.facts import DeploymentFacts
from deploykit.advisories.notes import note_text
from deploykit.advisories.schema import (
    Advisory,
    AdvisoryMode,
    Conditions,
    IntRange,
    VersionRange,
    VllmRange,
)
from deploykit.vllm_compat import parse_version

Status = Literal["applies", "does_not_apply", "unknown"]


class Check(BaseModel):
    """One condition: met (True), not met (False) or unknown (None: a fact deploykit lacks here)."""

    model_config = ConfigDict(extra="forbid")

    condition: str
    met: bool | None
    detail: str


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    status: Status
    checks: list[Check]

    @property
    def why(self) -> str:
        """The conditions that decided it: the failed ones, else the unknown ones, else all."""
        wanted: dict[Status, bool | None] = {"does_not_apply": False, "unknown": None, "applies": True}
        chosen = [c for c in self.checks if c.met is wanted[self.status]]
        return "; ".join(f"{c.condition}: {c.detail}" for c in chosen) or "no conditions"


class FixCall(BaseModel):
    """What a deploykit fix's own rule (decide() with mode auto) says for this deployment."""

    called_for: bool
    reason: str
    enabled: bool


Outcome = Literal["applied", "warned", "ignored", "fixed", "fix_off", "in_place"]


class AdvisoryOutcome(BaseModel):
    """An advisory that applies to a plan, and what the plan did about it (recorded with every plan)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    title: str
    references: list[str] = Field(description="upstream threads, as repo#number URLs")
    mode: str = Field(description="apply, warn or ignore; `fix` for a deploykit fix")
    outcome: Outcome
    change: str = Field(description="the exact change to the launch: made (applied) or to make (warned)")
    why: str = Field(description="why it applies: the conditions met")
    detail: str = Field(default="", description="what the default costs, or a figure for this deployment")


# --- matching --------------------------------------------------------------------------------------------


def _version_check(vllm: VllmRange, version: str | None) -> Check | None:
    if vllm.affected_from is None and vllm.fixed_in is None:
        return None
    span = f"[{vllm.affected_from or 'earliest known'}, {vllm.fixed_in or 'no fix yet'})"
    parsed = parse_version(version)
    if parsed is None:
        return Check(condition="vllm", met=None, detail=f"target vLLM unknown; affected {span}")
    low = parse_version(vllm.affected_from)
    high = parse_version(vllm.fixed_in)
    met = (low is None or parsed >= low) and (high is None or parsed < high)
    fixed = "" if met or high is None or parsed < high else f", fixed in {vllm.fixed_in}"
    return Check(condition="vllm", met=met, detail=f"target {version}, affected {span}{fixed}")


def _one_of(name: str, value: str | None, wanted: list[str]) -> Check:
    if value is None:
        return Check(condition=name, met=None, detail="unknown")
    met = value.lower() in {w.lower() for w in wanted}
    return Check(condition=name, met=met, detail=f"{value} ({'in' if met else 'not in'} {', '.join(wanted)})")


def _switch(name: str, value: bool | None, wanted: bool) -> Check:
    if value is None:
        return Check(condition=name, met=None, detail="unknown")
    return Check(condition=name, met=value is wanted, detail=f"{'on' if value else 'off'}")


def _in_range(name: str, value: int | None, wanted: IntRange, unit: str = "") -> Check:
    if value is None:
        return Check(condition=name, met=None, detail="unknown")
    met = (wanted.min is None or value >= wanted.min) and (wanted.max is None or value <= wanted.max)
    bounds = (
        f"{wanted.min if wanted.min is not None else '-'}..{wanted.max if wanted.max is not None else '-'}"
    )
    return Check(condition=name, met=met, detail=f"{value}{unit} (wanted {bounds})")


def _package_version(text: str) -> tuple[int, ...]:
    """`0.6.16rc5` < `0.6.16` < `0.6.16.post4`: release numbers, then -1 (pre), 0 or 1 (post), its number."""
    release, stage, number = text, 0, 0
    for marker, rank in (("rc", -1), ("a", -1), ("b", -1), (".post", 1)):
        if marker in text:
            release, _, tail = text.partition(marker)
            stage, number = rank, int(tail or 0)
            break
    parts = [int(p) for p in release.split(".")] + [0] * 4
    return (*parts[:4], stage, number)


def _version_in(name: str, value: str | None, wanted: VersionRange) -> Check:
    if value is None:
        return Check(condition=name, met=None, detail="unknown")
    try:
        have = _package_version(value)
    except ValueError:
        return Check(condition=name, met=None, detail=f"{value} (not a version deploykit compares)")
    low = wanted.min is None or have >= _package_version(wanted.min)
    high = wanted.below is None or have < _package_version(wanted.below)
    span = f"[{wanted.min or '-'}, {wanted.below or '-'})"
    return Check(condition=name, met=low and high, detail=f"{value} (affected {span})")


_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def _same_setting(have: str | None, want: str) -> bool:
    """vLLM's boolean variables read `1`/`true` alike (envs.py), so those compare as booleans."""
    if have is None:
        return False
    have, want = have.strip().lower(), want.strip().lower()
    return have == want or any(have in group and want in group for group in (_TRUE, _FALSE))


def _env_check(wanted: dict[str, str], env: dict[str, str]) -> Check:
    seen = ", ".join(f"{key}={env.get(key, '(unset)')}" for key in wanted)
    met = all(_same_setting(env.get(key), value) for key, value in wanted.items())
    return Check(condition="env", met=met, detail=seen)


def _gpu_checks(when: Conditions, facts: DeploymentFacts) -> list[Check]:
    checks: list[Check] = []
    gpus = facts.gpus
    names = ", ".join(sorted({f"{g.name} (CC {g.compute_capability})" for g in gpus})) or "no GPU"

    def any_gpu(condition: str, met: bool) -> Check:
        return Check(condition=condition, met=met if gpus else None, detail=names)

    if when.gpu_arch is not None:
        checks.append(any_gpu("gpu_arch", any(g.arch in when.gpu_arch for g in gpus)))
    if when.compute_capability_major is not None:
        majors = when.compute_capability_major
        checks.append(
            any_gpu("compute_capability", any(g.compute_capability_tuple[0] in majors for g in gpus))
        )
    if when.compute_capability_below is not None:
        limit = tuple(int(p) for p in when.compute_capability_below.split("."))
        checks.append(
            any_gpu("compute_capability_below", any(g.compute_capability_tuple < limit for g in gpus))
        )
    if when.gpu_name_contains is not None:
        wanted = [w.lower() for w in when.gpu_name_contains]
        checks.append(any_gpu("gpu_name", any(w in g.name.lower() for g in gpus for w in wanted)))
    if when.bf16_native is not None:
        checks.append(any_gpu("bf16_native", all(g.bf16_native is when.bf16_native for g in gpus)))
    return checks


def _link_checks(when: Conditions, facts: DeploymentFacts) -> list[Check]:
    checks: list[Check] = []
    for name, wanted in (("p2p", when.p2p), ("nvlink", when.nvlink)):
        if wanted is None:
            continue
        links = facts.gpu_links
        if links is None:
            checks.append(
                Check(condition=name, met=None, detail="not probed (facts saved before links were)")
            )
            continue
        if not links:
            checks.append(Check(condition=name, met=wanted is False, detail="one GPU: no links"))
            continue
        if name == "p2p":
            value = all(link.p2p_read == "ok" and link.p2p_write == "ok" for link in links)
            seen = ", ".join(sorted({f"read {x.p2p_read}, write {x.p2p_write}" for x in links}))
        else:
            value = all(link.nvlink == "ok" for link in links)
            seen = ", ".join(sorted({f"nvlink {x.nvlink}" for x in links}))
        checks.append(Check(condition=name, met=value is wanted, detail=seen))
    return checks


def conditions_checks(when: Conditions, facts: DeploymentFacts) -> list[Check]:
    checks: list[Check] = []
    if when.platform is not None:
        checks.append(_one_of("platform", facts.platform, [when.platform]))
    checks += _gpu_checks(when, facts)
    if when.tensor_parallel is not None:
        checks.append(_in_range("tensor_parallel", facts.tensor_parallel, when.tensor_parallel))
    checks += _link_checks(when, facts)
    if when.architectures is not None:
        archs = facts.architectures
        met = None if archs is None else any(a in when.architectures for a in archs)
        checks.append(Check(condition="architectures", met=met, detail=", ".join(archs or ["unknown"])))
    lists: list[tuple[str, str | None, list[str] | None]] = [
        ("checkpoint_dtype", facts.checkpoint_dtype, when.checkpoint_dtype),
        ("dtype", facts.dtype, when.dtype),
        ("quantization", facts.quantization, when.quantization),
        ("kv_cache_dtype", facts.kv_cache_dtype, when.kv_cache_dtype),
        ("attention_backend", facts.attention_backend, when.attention_backend),
        ("cudagraph_mode", facts.cudagraph_mode, when.cudagraph_mode),
        ("model_runner", facts.model_runner, list(when.model_runner) if when.model_runner else None),
        ("speculative_method", facts.speculative_method, when.speculative_method),
        ("mamba_cache_mode", facts.mamba_cache_mode, when.mamba_cache_mode),
        ("kv_connector", facts.kv_connector, when.kv_connector),
        ("moe_backend", facts.moe_backend, when.moe_backend),
        ("gdn_prefill_backend", facts.gdn_prefill_backend, when.gdn_prefill_backend),
    ]
    checks += [_one_of(name, value, wanted) for name, value, wanted in lists if wanted is not None]
    switches: list[tuple[str, bool | None, bool | None]] = [
        ("lora", facts.lora, when.lora),
        ("speculative_decoding", facts.speculative_decoding, when.speculative_decoding),
        ("prefix_caching", facts.prefix_caching, when.prefix_caching),
        ("async_scheduling", facts.async_scheduling, when.async_scheduling),
        ("sequence_parallelism", facts.sequence_parallelism, when.sequence_parallelism),
        ("penalties", facts.penalties, when.penalties),
        ("tool_calling", facts.tool_calling, when.tool_calling),
        ("cpu_offload", facts.cpu_offload, when.cpu_offload),
        ("expert_parallel", facts.expert_parallel, when.expert_parallel),
        ("tensor_parallel_spans_nodes", facts.tensor_parallel_spans_nodes, when.tensor_parallel_spans_nodes),
    ]
    checks += [_switch(name, value, wanted) for name, value, wanted in switches if wanted is not None]
    if when.nodes is not None:
        checks.append(_in_range("nodes", facts.nodes, when.nodes))
    if when.data_parallel is not None:
        checks.append(_in_range("data_parallel", facts.data_parallel, when.data_parallel))
    if when.max_num_seqs is not None:
        checks.append(_in_range("max_num_seqs", facts.max_num_seqs, when.max_num_seqs))
    if when.env is not None:
        checks.append(_env_check(when.env, facts.env))
    if when.flashinfer_version is not None:
        checks.append(_version_in("flashinfer_version", facts.flashinfer_version, when.flashinfer_version))
    if when.penalty_table_mib is not None:
        checks.append(_in_range("penalty_table_mib", facts.penalty_table_mib, when.penalty_table_mib, " MiB"))
    return checks


def _status(checks: list[Check]) -> Status:
    if any(c.met is False for c in checks):
        return "does_not_apply"
    if all(c.met is True for c in checks):
        return "applies"
    return "unknown"


def judge(advisory: Advisory, facts: DeploymentFacts, fix_calls: dict[str, FixCall] | None = None) -> Verdict:
    checks: list[Check] = []
    version = _version_check(advisory.vllm, facts.vllm_version)
    if version is not None:
        checks.append(version)
    if advisory.action.kind == "fix":
        call = (fix_calls or {}).get(advisory.action.fix or "")
        if call is None:
            checks.append(
                Check(condition="fix", met=None, detail="decided per profile by the fix's own rule")
            )
        else:
            checks.append(
                Check(condition=f"fix {advisory.action.fix}", met=call.called_for, detail=call.reason)
            )
        return Verdict(id=advisory.id, status=_status(checks), checks=checks)
    checks += conditions_checks(advisory.when, facts)
    if advisory.any_of:
        groups = [conditions_checks(group, facts) for group in advisory.any_of]
        states = [_status(group) for group in groups]
        met = True if "applies" in states else (False if all(s == "does_not_apply" for s in states) else None)
        detail = " | ".join("; ".join(f"{c.condition} {c.detail}" for c in group) for group in groups)
        checks.append(Check(condition="any_of", met=met, detail=detail))
    return Verdict(id=advisory.id, status=_status(checks), checks=checks)


def judge_all(facts: DeploymentFacts, fix_calls: dict[str, FixCall] | None = None) -> list[Verdict]:
    return [judge(advisory, facts, fix_calls) for advisory in catalog_advisories()]


# --- acting on them, for one plan ------------------------------------------------------------------------


class Advice(BaseModel):
    """The advisories' effect on one plan."""

    argv: list[str]
    env: dict[str, str]
    outcomes: list[AdvisoryOutcome]
    verdicts: list[Verdict]
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


def _words(args: list[str], env: dict[str, str]) -> str:
    """A workaround as it reads in a launch command: environment assignments, then the arguments."""
    parts = [f"{key}={shlex.quote(value)}" for key, value in env.items()]
    if args:
        parts.append(shlex.join(args))
    return " ".join(parts)


def mode_errors(modes: dict[str, AdvisoryMode]) -> list[str]:
    """A profile's `advisories:` entries that name no advisory, or a deploykit fix (set under `fixes:`)."""
    known = {advisory.id: advisory for advisory in catalog_advisories()}
    problems = []
    for name in modes:
        advisory = known.get(name)
        if advisory is None:
            problems.append(
                f"the profile sets advisories.{name}, but no advisory has that id: see `deploykit advisories`"
            )
        elif advisory.action.kind == "fix":
            problems.append(
                f"advisories.{name} is deploykit's fix {advisory.action.fix}: set it under `fixes:` "
                f"({advisory.action.fix}: on|off|auto) instead"
            )
    return problems


def advise(
    facts: DeploymentFacts,
    argv: list[str],
    env: dict[str, str],
    modes: dict[str, AdvisoryMode],
    fix_calls: dict[str, FixCall],
) -> Advice:
    """Judge every advisory on `facts` (read from this argv and env), then apply or warn."""
    argv, env = list(argv), dict(env)
    outcomes: list[AdvisoryOutcome] = []
    warnings: list[str] = []
    verdicts = judge_all(facts, fix_calls)
    by_id = {advisory.id: advisory for advisory in catalog_advisories()}
    for verdict in verdicts:
        if verdict.status != "applies":
            continue
        advisory = by_id[verdict.id]
        action = advisory.action
        refs = [f"{r.label} {r.url}" for r in advisory.references]
        base = {"id": advisory.id, "title": advisory.title, "references": refs, "why": verdict.why}
        if action.kind == "fix":
            call = fix_calls[action.fix or ""]
            outcome: Outcome = "fixed" if call.enabled else "fix_off"
            change = f"DEPLOYKIT_FIXES includes {action.fix}" if call.enabled else f"fix {action.fix} is off"
            outcomes.append(AdvisoryOutcome(**base, mode="fix", outcome=outcome, change=change))
            continue
        mode = modes.get(advisory.id, AdvisoryMode(action.default))
        detail = note_text(action.note, facts) if action.note else action.why
        labels = ", ".join(r.label for r in advisory.references)
        if mode is AdvisoryMode.IGNORE:
            outcomes.append(
                AdvisoryOutcome(**base, mode=mode.value, outcome="ignored", change="", detail=detail)
            )
            continue
        change = _words(action.args, action.env)
        new_argv = argv_reader.apply_args(argv, action.args) if action.args else argv
        in_place = new_argv == argv and all(env.get(k) == v for k, v in action.env.items())
        if action.kind == "workaround" and in_place:
            outcomes.append(AdvisoryOutcome(**base, mode=mode.value, outcome="in_place", change=change))
            continue
        if action.kind == "workaround" and mode is AdvisoryMode.APPLY:
            argv = new_argv
            env.update(action.env)
            outcomes.append(
                AdvisoryOutcome(**base, mode=mode.value, outcome="applied", change=change, detail=detail)
            )
            continue
        if change:
            text = (
                f"the workaround is not applied ({detail}): {change}; "
                f"apply it with `advisories: {{{advisory.id}: apply}}` in the profile"
            )
        else:
            text = detail
        warnings.append(f"advisory {advisory.id} ({labels}): {advisory.symptom}. {text}")
        outcomes.append(
            AdvisoryOutcome(**base, mode=mode.value, outcome="warned", change=change, detail=detail)
        )
    return Advice(argv=argv, env=env, outcomes=outcomes, verdicts=verdicts, warnings=warnings)
