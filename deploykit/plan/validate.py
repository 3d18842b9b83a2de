"""The plan's argv checked as the parser of the vLLM it targets would (deploykit.vllm_options), recorded."""

from __future__ import annotations

from pathlib import Path

from deploykit.plan.model import ArgvValidation, Plan


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
