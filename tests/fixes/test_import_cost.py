"""Issue 33: no fix module imports vLLM (or torch) at import time, so a vLLM that lost a fix's target gets a
"target missing in vLLM X" row, never a ModuleNotFoundError from an import. Only the processor class module
(`_penalties_processor`, a subclass of vLLM's V1 interface) needs vLLM, and it is reached only through
`penalties.DevicePenaltiesProcessor`, which checks the target first."""

from __future__ import annotations

import subprocess
import sys

from deploykit.fixes import FIX_MODULES

IMPORTED_ON_DEMAND = ("deploykit.fixes._penalties_stand_aside",)  # the target check's module


def test_importing_every_fix_module_imports_no_vllm_and_no_torch() -> None:
    modules = [*FIX_MODULES.values(), *IMPORTED_ON_DEMAND, "deploykit.fixes.status"]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
