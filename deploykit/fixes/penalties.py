"""Device penalties fix: sampling penalties on the device with O(batch) host work per step.

See docs/fixes/device-penalties.md. The decision rule is pure; the processor class needs vLLM and torch
and is built on first access (`deploykit.fixes.penalties:DevicePenaltiesProcessor`).

Obsolete from vLLM 0.34, which deleted the V1 model runner and with it everything this fix patches and
plugs into (the V1 sampler's host penalty path, vllm.v1.sample.logits_processor): the V2 runner, the only
one left, keeps penalty state on the device (the `v2-penalty-table` advisory says what that costs).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deploykit.fixes.base import (
    OBSOLETE_PREFIX,
    TURNED_OFF,
    Decision,
    DecisionInputs,
    Fix,
    FixAdvisory,
    FixDecision,
    FixError,
    FixMode,
    TargetCheck,
    TargetStatus,
    decision_maker,
    effective_runner,
    upstream_guard,
)
from deploykit.vllm_compat import V1_RUNNER_REMOVED_IN, release_label, v1_runner_removed

if TYPE_CHECKING:
    from deploykit.trace_records import HeaderLine, ModuleLine

NAME = "device_penalties"
SUMMARY = "repetition/presence/frequency penalties on the device, O(batch) host work per step"
PATCHES = "vLLM V1 model runner's host penalty path; adds a V1-interface logits processor"
# The known-bad combination it fixes, as the advisory catalog lists it (`deploykit advisories`).
ADVISORY: FixAdvisory = {
    "title": "sampling penalties make TPOT 4-7x worse under load (V1 model runner)",
    "symptom": "V1 rebuilds the padded token history on the host every step when any request uses penalties",
    "kind": "performance",
    "references": [{"number": 47540, "kind": "pr", "note": "keep penalty statistics between steps; open"}],
    "vllm": {
        "fixed_in": "0.34.0",
        # Not fixed upstream: obsolete. 0.34.0 deleted the V1 model runner with its host penalty path
        # (vllm/v1/sample/ops/penalties.py, vllm.v1.sample.logits_processor), so nothing it describes exists.
        "evidence": (
            "open upstream (#47540) up to 0.33; vLLM 0.34.0 removed the V1 model runner, so the host-side "
            "penalty cost cannot happen there: the V2 runner keeps bin counts on the GPU "
            "(see v2-penalty-table)"
        ),
    },
}
PROCESSOR = "deploykit.fixes.penalties:DevicePenaltiesProcessor"
LAUNCH_FLAGS: tuple[str, ...] = ("--logits-processors",)
# The vLLM source files the target lives in, relative to the folder holding `vllm/`: what
# `make vllm-release` (tools/vllm_release.py) judges "changed" or "gone" on; `file::Class` narrows a file to
# the one class the fix patches.
TARGET_SOURCES: tuple[str, ...] = (
    "vllm/v1/sample/sampler.py",
    "vllm/v1/sample/metadata.py",
    "vllm/v1/sample/ops/penalties.py",
    "vllm/v1/sample/logits_processor/__init__.py",
    "vllm/v1/sample/logits_processor/interface.py",
    "vllm/v1/worker/gpu_input_batch.py",
)


def decide(inputs: DecisionInputs, mode: FixMode) -> FixDecision:
    result = decision_maker(NAME, mode)
    if mode is FixMode.OFF:
        return result(Decision.NOT_NEEDED, TURNED_OFF)
    version = inputs.vllm_version or "unknown"
    if v1_runner_removed(inputs.vllm_version):
        why = obsolete_reason(version)
        if mode is FixMode.ON:
            return result(Decision.IMPOSSIBLE, f"forced on, but it is {why}")
        return result(Decision.NOT_NEEDED, why)
    runner = effective_runner(inputs)
    if runner == "v2":
        why = (
            f"vLLM {version} runs the V2 model runner here, which keeps penalty state on the device and "
            "rejects V1-interface logits processors"
        )
        if mode is FixMode.ON:
            return result(
                Decision.IMPOSSIBLE, f"forced on, but {why}; set `serve.model_runner: v1` to use it"
            )
        return result(Decision.NOT_NEEDED, why)
    if mode is FixMode.ON:
        return result(Decision.ENABLED, f"forced on by the profile (vLLM {version}, V1 model runner)")
    if not inputs.penalties_expected:
        return result(Decision.NOT_NEEDED, "the profile does not expect sampling penalties")
    return result(
        Decision.ENABLED,
        f"penalties expected and vLLM {version} runs the V1 model runner, which rebuilds penalty inputs "
        "on the host every step",
    )


def obsolete_reason(version: str) -> str:
    """Why the fix stands aside on a vLLM without the V1 runner (the reason starts with OBSOLETE_PREFIX)."""
    removed = release_label(V1_RUNNER_REMOVED_IN)
    return (
        f"{OBSOLETE_PREFIX}{removed}: vLLM {version} has no V1 model runner (removed in {removed}), so "
        "neither the host penalty path this fix replaces nor the interface it plugs into exists; the V2 "
        "runner keeps penalty state on the device (see the v2-penalty-table advisory)"
    )


def launch_args(inputs: DecisionInputs) -> list[str]:
    return ["--logits-processors", PROCESSOR]


def plan_warnings(inputs: DecisionInputs, decision: FixDecision) -> list[str]:
    """The V1 runner the profile pins for this fix: a deliberate choice a reader of the plan should see."""
    if decision.decision is Decision.ENABLED and inputs.model_runner == "v1":
        return [f"the profile selects vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0) for {NAME}"]
    return []


def trace_suggestion(
    culprit: ModuleLine, header: HeaderLine | None, lines: Sequence[ModuleLine]
) -> str | None:
    """Penalties change which token is sampled, never a module's output: a trace never points here."""
    return None


def check_target() -> TargetCheck:
    """Is the V1 host penalty path there, in the shape the stand-aside patch expects?"""
    if importlib.util.find_spec("vllm") is None:
        return TargetCheck(status=TargetStatus.VLLM_MISSING, target=PATCHES, detail="vLLM is not installed")
    from deploykit.fixes import _penalties_stand_aside

    return _penalties_stand_aside.check_target()


def apply() -> str:
    """Make vLLM's host penalty path stand aside for batches served by DevicePenaltiesProcessor."""
    note = upstream_guard(NAME, check_target())
    if note is not None:
        return note
    from deploykit.fixes import _penalties_stand_aside

    return _penalties_stand_aside.install_stand_aside()


def __getattr__(name: str) -> Any:
    # PEP 562: `deploykit.fixes.penalties:DevicePenaltiesProcessor` loads torch and vLLM only when asked.
    if name == "DevicePenaltiesProcessor":
        check = check_target()  # never a ModuleNotFoundError from a vLLM without the V1 interface
        if check.status in (TargetStatus.TARGET_MISSING, TargetStatus.VLLM_MISSING):
            raise FixError(f"deploykit fix {NAME}: DevicePenaltiesProcessor cannot load: {check.detail}")
        from deploykit.fixes._penalties_processor import DevicePenaltiesProcessor

        return DevicePenaltiesProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:  # mypy holds this module to the Fix protocol
    from deploykit.fixes import penalties as _this_fix

    _CHECKED: Fix = _this_fix
