"""`deploykit fixes`: each fix checked against the installed vLLM."""

from __future__ import annotations

from pydantic import BaseModel

from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.fixes.base import TargetCheck, TargetStatus
from deploykit.installed import installed_vllm_version
from deploykit.vllm_compat import TESTED_VLLM, version_in_range


class FixRow(BaseModel):
    name: str
    summary: str
    patches: str
    vllm_version: str | None
    status: TargetStatus
    detail: str
    tested_vllm: str = TESTED_VLLM  # the vLLM versions this deploykit is tested with
    in_tested_range: bool | None = None  # whether vllm_version is one of them (None: unknown)


def fix_statuses() -> list[FixRow]:
    version = installed_vllm_version()
    rows = []
    for name in FIX_NAMES:
        module = load_fix(name)
        if version is None:
            check = TargetCheck(
                status=TargetStatus.VLLM_MISSING, target=module.PATCHES, detail="vLLM is not installed"
            )
        else:
            check = module.check_target()
        rows.append(
            FixRow(
                name=name,
                summary=module.SUMMARY,
                patches=module.PATCHES,
                vllm_version=version,
                status=check.status,
                detail=check.detail,
                in_tested_range=version_in_range(version),
            )
        )
    return rows
