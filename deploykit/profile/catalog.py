"""`deploykit profiles list`: every profile judged against one set of GPU facts.

The judging is a plan per profile; the planner is passed in (the CLI passes `deploykit.plan.make_plan`),
so profiles sit below the plan in the layers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel

from deploykit.probe.facts import ProbeFacts
from deploykit.profile.load import list_profile_paths, load_profile
from deploykit.profile.schema import LoadedProfile, ProfileError


class ProfileRow(BaseModel):
    name: str
    path: str
    status: Literal["compatible", "compatible_with_warnings", "incompatible", "invalid"]
    enabled_fixes: list[str]
    reasons: list[str]
    advisories: list[str] = []  # `id (outcome)` of the known-bad combinations that apply (plan.advisories)


class RequirementsView(Protocol):
    @property
    def status(self) -> str: ...
    @property
    def problems(self) -> list[str]: ...
    @property
    def notes(self) -> list[str]: ...


class PlanView(Protocol):
    """What the catalog reads of a plan."""

    @property
    def requires(self) -> RequirementsView: ...
    @property
    def errors(self) -> list[str]: ...
    @property
    def warnings(self) -> list[str]: ...
    @property
    def enabled_fixes(self) -> list[str]: ...
    @property
    def advisory_summary(self) -> list[str]: ...


Planner = Callable[[LoadedProfile, ProbeFacts], PlanView]


def assess_profiles(
    facts: ProbeFacts, extra_dir: Path | None = None, *, make_plan: Planner
) -> list[ProfileRow]:
    rows = []
    for path in list_profile_paths(extra_dir):
        try:
            loaded = load_profile(str(path))
        except ProfileError as exc:
            rows.append(
                ProfileRow(
                    name=path.stem,
                    path=str(path),
                    status="invalid",
                    enabled_fixes=[],
                    reasons=[str(issue) for issue in exc.issues],
                )
            )
            continue
        plan = make_plan(loaded, facts)
        if plan.errors or plan.requires.status == "incompatible":
            status: Literal["compatible", "compatible_with_warnings", "incompatible", "invalid"] = (
                "incompatible"
            )
            reasons = [*plan.errors, *plan.requires.problems]
        elif plan.warnings:
            status, reasons = "compatible_with_warnings", plan.warnings
        else:
            status, reasons = "compatible", plan.requires.notes
        rows.append(
            ProfileRow(
                name=loaded.profile.name,
                path=str(path),
                status=status,
                enabled_fixes=plan.enabled_fixes,
                reasons=reasons,
                advisories=plan.advisory_summary,
            )
        )
    return rows
