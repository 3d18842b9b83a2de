"""What a plan is: the whole decision for one deployment, as `plan --format json` writes it and serve
stores it."""

from __future__ import annotations

import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from deploykit.advisories import (
    AdvisoryOutcome,
    Verdict,
)
from deploykit.fixes.base import Decision, FixDecision
from deploykit.plan.layout import ParallelLayout
from deploykit.plan.requirements import RequirementsCheck
from deploykit.probe.facts import ProbeFacts


class ProfileRef(BaseModel):
    name: str
    id: str
    path: str


class ArgvValidation(BaseModel):
    status: Literal["ok", "error", "skipped"]
    detail: str


class Plan(BaseModel):
    """The whole decision for one deployment. `env` holds secrets only as `${NAME}` references."""

    model_config = ConfigDict(extra="forbid")

    profile: ProfileRef
    facts: ProbeFacts
    requires: RequirementsCheck
    layout: ParallelLayout = Field(
        description="ranks, nodes and the GPUs each node gives the group (render and serve read it here)"
    )
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
