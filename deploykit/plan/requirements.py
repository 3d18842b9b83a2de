"""The profile's `requires:` against the GPU facts: compatible, incompatible (with why), or unchecked. The
GPUs checked are those the parallel layout uses (deploykit.plan.layout); a layout the node cannot hold is the
plan's error (layout.fit_problem), not a requirement."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from deploykit.plan.layout import ParallelLayout
from deploykit.probe.facts import GpuFacts, ProbeFacts
from deploykit.profile.schema import Profile


class RequirementsCheck(BaseModel):
    status: Literal["compatible", "warnings", "incompatible", "unchecked"]
    problems: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def check_requirements(profile: Profile, facts: ProbeFacts, layout: ParallelLayout) -> RequirementsCheck:
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
    used = facts.gpus[: layout.gpu_request]
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
