"""A pytest plugin for the tier's child runs only (`-p tests.vllm_releases.child_plugin`).

vLLM 0.34's CpuPlatform.check_and_update_config refuses to build any config on an x86 CPU without
triton-cpu ("vLLM on x86 CPUs requires Triton (triton-cpu)."), where 0.33 only warned; the module-level fix
tests build a default VllmConfig for vLLM's distributed state and layers. The tier runs no kernel (the
wheel's compiled parts are left out), so in the child, and only while that check runs, vLLM's HAS_TRITON
reads True: the refusal is the one thing in that function that reads it (vllm/platforms/cpu.py), so the
config built is the one a CPU host with triton-cpu gets. The main run (the installed 0.32) is untouched.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.vllm_releases.releases import in_child


def pytest_configure(config: pytest.Config) -> None:
    if not in_child():
        return
    try:
        from vllm.platforms import cpu
    except ImportError:
        return
    original = cpu.CpuPlatform.__dict__["check_and_update_config"].__func__
    if getattr(original, "deploykit_tier", False):
        return

    def check_and_update_config(cls: Any, vllm_config: Any) -> None:
        import vllm.triton_utils as triton_utils

        saved = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            original(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = saved

    check_and_update_config.deploykit_tier = True  # type: ignore[attr-defined]
    cpu.CpuPlatform.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[method-assign,assignment]
