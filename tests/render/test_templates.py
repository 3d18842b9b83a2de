"""Rendering stays free of torch/vLLM (where templates are found: tests/test_packaging.py)."""

from __future__ import annotations

from pathlib import Path

from tests.cli_process import run_python
from tests.unit_prefix import ABSENT_PREFIX


def test_rendering_never_imports_torch_or_vllm(tmp_path: Path) -> None:
    code = f"""
import sys
from tests.cli_runner import CliRunner
from deploykit.cli import app
for kind in ("systemd", "helm"):
    args = ["render", kind, "-p", "demo-cpu", "--out", r"{tmp_path}/" + kind]
    args += ["--prefix", {ABSENT_PREFIX!r}] if kind == "systemd" else []
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 2), result.output
heavy = sorted(m for m in ("torch", "vllm", "transformers") if m in sys.modules)
print("heavy:", heavy)
"""
    # forked from a warm interpreter that never imported either (tests/cli_process.py checks at its start)
    result = run_python(["-c", code])
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
    assert (tmp_path / "systemd" / "deploykit-demo-cpu.service").is_file()
