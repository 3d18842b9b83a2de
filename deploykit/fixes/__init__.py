"""The fix registry: one line per fix, below. `plan` reads the decision rules, the trace report the
suggestions, the vLLM plugin applies the patches; the profile's `fixes:` modes (deploykit.profile.schema),
the owned launch flags, the advisory catalog's entry (deploykit.advisories.catalog), `deploykit fixes`, the
index in docs/fixes.md (tools/fixes_index.py) and the fix targets of `make vllm-release`'s report
(tools/vllm_release.py) are all derived from it. None of them names a fix, so a new fix is one module and
one line here (tests/fixes/test_registry.py adds a throw-away one to show it).

Each fix is one module exposing (the `Fix` protocol in base.py, which mypy checks through the module's
last lines):
    NAME: str                 the key used in profiles, `--fix` and DEPLOYKIT_FIXES
    SUMMARY: str              one line for people
    PATCHES: str              what in vLLM it changes
    LAUNCH_FLAGS: tuple[str, ...]                  the `vllm serve` flags launch_args may add
    TARGET_SOURCES: tuple[str, ...]                the vLLM files its target lives in (`file::Class`: one
                                                   class of it), relative to the folder holding `vllm/`:
                                                   what `make vllm-release`'s report judges changed or gone
    ADVISORY: FixAdvisory                          its advisory catalog entry (title, symptom, evidence)
    decide(inputs, mode) -> FixDecision            pure, no torch/vllm import
    launch_args(inputs) -> list[str]               extra `vllm serve` flags when enabled
    plan_warnings(inputs, decision) -> list[str]   pure: what a plan with this decision warns about
    trace_suggestion(culprit, header, lines) -> str | None
                                                   pure: evidence that a traced NaN is this fix's target
    check_target() -> TargetCheck                  imports vLLM: does the target exist as expected?
    apply() -> str                                 patches vLLM in this process; returns the target patched
Importing a fix module must stay cheap: torch and vLLM are imported inside functions only. This module
imports nothing of deploykit at run time, so the profile schema can read the names without a circle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from deploykit.fixes.base import Fix

FIX_MODULES: dict[str, str] = {
    "fp32_projection": "deploykit.fixes.fp32_projection",
    "matmul_lora": "deploykit.fixes.matmul_lora",
    "device_penalties": "deploykit.fixes.penalties",
}

FIX_NAMES: tuple[str, ...] = tuple(FIX_MODULES)


def load_fix(name: str) -> Fix:
    try:
        module_path = FIX_MODULES[name]
    except KeyError:
        known = ", ".join(FIX_NAMES)
        raise KeyError(f"unknown fix {name!r}; known fixes: {known}") from None
    return cast("Fix", importlib.import_module(module_path))
