"""The one guard every fix's apply() starts with: patch, leave a fixed-upstream vLLM alone, or refuse."""

from __future__ import annotations

import logging

import pytest

from deploykit.fixes.base import FixError, TargetCheck, TargetStatus, upstream_guard
from deploykit.installed import vllm_version_label


def check(status: TargetStatus) -> TargetCheck:
    return TargetCheck(status=status, target="vllm.x.Y", detail="what was seen")


def test_an_applicable_target_is_patched() -> None:
    assert upstream_guard("some_fix", check(TargetStatus.APPLICABLE)) is None


def test_fixed_upstream_patches_nothing_and_says_so_in_vllms_log(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="vllm"):
        note = upstream_guard("some_fix", check(TargetStatus.FIXED_UPSTREAM))
    assert note == f"nothing patched: vLLM {vllm_version_label()} is fixed upstream (what was seen)"
    assert caplog.records[-1].name == "vllm.deploykit.some_fix"
    assert caplog.records[-1].getMessage() == f"deploykit some_fix: {note}"


@pytest.mark.parametrize("status", [TargetStatus.TARGET_MISSING, TargetStatus.VLLM_MISSING])
def test_anything_else_is_refused_with_one_wording(status: TargetStatus) -> None:
    with pytest.raises(FixError) as caught:
        upstream_guard("some_fix", check(status))
    assert str(caught.value) == (
        f"some_fix: cannot apply to vLLM {vllm_version_label()}: {status.value}: what was seen"
    )
