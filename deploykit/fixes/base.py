"""The vocabulary every fix speaks: modes, decisions, the facts a decision may use, target status, and the
`Fix` protocol: everything particular to one fix is in its module, so `plan` and `trace` name none."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from deploykit import errors
from deploykit.installed import vllm_version_label
from deploykit.probe.facts import GpuFacts

if TYPE_CHECKING:
    from deploykit.trace_records import HeaderLine, ModuleLine


class FixMode(StrEnum):
    """What a profile (`fixes.NAME`) or `--fix NAME=...` asks of a fix."""

    AUTO = "auto"
    ON = "on"
    OFF = "off"


class FixAdvisory(TypedDict):
    """A fix's entry in the advisory catalog (`deploykit advisories`), less what the registry gives: its id
    (the name with dashes) and its action (the fix itself, applied by default). The fields are the
    catalog's (docs/advisories.md); their conditions are the fix's decide(), so none are stated here."""

    title: str
    symptom: str
    kind: str  # hang, corruption or performance (deploykit.advisories.schema.AdvisoryKind)
    references: list[dict[str, Any]]
    vllm: dict[str, Any]


class Decision(StrEnum):
    ENABLED = "enabled"
    NOT_NEEDED = "not_needed"
    IMPOSSIBLE = "impossible"


class FixDecision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    mode: FixMode
    decision: Decision
    reason: str = Field(description="one line naming the facts the decision used")


TURNED_OFF = "turned off by the profile"
OBSOLETE_PREFIX = "obsolete from vLLM "
"""How a decision's reason starts when the target vLLM removed what the fix patches (plan names such a
fix nowhere as "unchecked": a release that removed its target has been read)."""


def decision_maker(name: str, mode: FixMode) -> Callable[[Decision, str], FixDecision]:
    """A fix's `result(decision, reason)` for one decide() call: the name and mode filled in."""

    def result(decision: Decision, reason: str) -> FixDecision:
        return FixDecision(name=name, mode=mode, decision=decision, reason=reason)

    return result


class TargetStatus(StrEnum):
    APPLICABLE = "applicable"
    FIXED_UPSTREAM = "fixed_upstream"
    TARGET_MISSING = "target_missing"  # detail: "target missing in vLLM X: <what>" (target_missing())
    VLLM_MISSING = "vllm_missing"


class TargetCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    status: TargetStatus
    target: str
    detail: str


class DecisionInputs(BaseModel):
    """Everything a fix rule may look at; pure data so rules are pure functions."""

    model_config = ConfigDict(extra="forbid")

    gpus: list[GpuFacts]
    vllm_version: str | None
    checkpoint_dtype: str | None
    model_architectures: list[str] = Field(default_factory=list)
    lora_enabled: bool = False
    lora_fully_sharded: bool = False
    penalties_expected: bool = False
    model_runner: str = Field(default="auto", description="auto, v1 or v2: the profile's runner choice")
    platform: str = Field(default="cuda", description="cuda or cpu: which vLLM build the deployment runs")
    compute_dtype: str | None = Field(
        default=None, description="float16, bfloat16 or float32: what the engine computes in (None: unknown)"
    )
    compute_dtype_source: str = Field(default="", description="where compute_dtype comes from, in one line")
    compute_dtype_refused: str | None = Field(
        default=None, description="why vLLM would refuse this dtype at start-up (quantization, model type)"
    )


def target_missing(target: str, what: str) -> TargetCheck:
    """The one way a fix reports that the installed vLLM lacks what it patches: a row in `deploykit
    fixes` and `plan`, and (through upstream_guard) one line naming the fix and version inside vLLM."""
    return TargetCheck(
        status=TargetStatus.TARGET_MISSING,
        target=target,
        detail=f"target missing in vLLM {vllm_version_label()}: {what}",
    )


def effective_runner(inputs: DecisionInputs) -> str:
    """The model runner the deployment gets: V2 from 0.34 (no other left), else the profile's choice, else
    this vLLM's default (v1 or v2)."""
    from deploykit.vllm_compat import default_model_runner, v1_runner_removed  # the plugin loads this module

    if v1_runner_removed(inputs.vllm_version):
        return "v2"  # the only runner left (a profile asking for v1 there is a plan error)
    if inputs.model_runner in ("v1", "v2"):
        return inputs.model_runner
    return default_model_runner(inputs.vllm_version, inputs.platform)


FixError = errors.FixError  # defined once, in deploykit.errors; raised here


def upstream_guard(name: str, check: TargetCheck) -> str | None:
    """What every fix checks before it patches. None: the target is there as expected, patch it. A note
    (also written to vLLM's log): this vLLM is fixed upstream, patch nothing. FixError: anything else."""
    version = vllm_version_label()
    if check.status is TargetStatus.FIXED_UPSTREAM:
        note = f"nothing patched: vLLM {version} is fixed upstream ({check.detail})"
        logging.getLogger(f"vllm.deploykit.{name}").info("deploykit %s: %s", name, note)
        return note
    if check.status is not TargetStatus.APPLICABLE:
        raise FixError(f"{name}: cannot apply to vLLM {version}: {check.status.value}: {check.detail}")
    return None


class Fix(Protocol):
    """What every fix module provides; mypy checks each module against it (each module's last lines)."""

    NAME: str  # the key used in profiles, `--fix` and DEPLOYKIT_FIXES
    SUMMARY: str  # one line for people
    PATCHES: str  # what in vLLM it changes
    LAUNCH_FLAGS: tuple[str, ...]  # the `vllm serve` flags launch_args may add: the fix owns them
    TARGET_SOURCES: tuple[str, ...]  # the vLLM files its target lives in (`file::Class`): release reports
    ADVISORY: FixAdvisory  # its entry in the advisory catalog: the known-bad combination it fixes

    def decide(self, inputs: DecisionInputs, mode: FixMode) -> FixDecision:
        """Pure: no torch or vLLM import."""
        ...

    def launch_args(self, inputs: DecisionInputs) -> list[str]:
        """Extra `vllm serve` flags when the fix is enabled."""
        ...

    def plan_warnings(self, inputs: DecisionInputs, decision: FixDecision) -> list[str]:
        """Pure: what a plan with this decision should warn about, beyond the decision itself."""
        ...

    def trace_suggestion(
        self, culprit: ModuleLine, header: HeaderLine | None, lines: Sequence[ModuleLine]
    ) -> str | None:
        """Pure: the evidence that this fix targets the module a trace found making the first non-finite
        value (`culprit`; `lines` are the trace's module records, in order), or None when it does not."""
        ...

    def check_target(self) -> TargetCheck:
        """Imports vLLM: does the patch target exist as expected?"""
        ...

    def apply(self) -> str:
        """Patches vLLM in this process; returns the target patched."""
        ...
