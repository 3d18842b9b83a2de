"""`deploykit fixes`: every fix checked against the installed vLLM (the CPU build 0.32 here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from deploykit.fixes import FIX_NAMES
from deploykit.vllm_compat import TESTED_VLLM


@pytest.mark.vllm_import  # `deploykit fixes` imports vLLM to check each fix's target
def test_fixes_command_reports_each_fix_against_the_installed_vllm() -> None:
    exe = Path(sys.executable).parent / "deploykit"
    result = subprocess.run([str(exe), "fixes", "-f", "json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert list(rows) == list(FIX_NAMES)
    assert all(row["vllm_version"] == "0.32.0+cpu" for row in rows.values())
    assert all(row["tested_vllm"] == TESTED_VLLM and row["in_tested_range"] is True for row in rows.values())
    assert rows["matmul_lora"]["status"] == "applicable"
    assert rows["device_penalties"]["status"] == "applicable"
    # The venv deliberately has no torchvision (it breaks beside the CPU torch), and vLLM 0.32's
    # gemma4_unified module cannot be imported without it: the fix says so instead of pretending.
    assert rows["fp32_projection"]["status"] == "target_missing"
    assert "torchvision" in rows["fp32_projection"]["detail"]
