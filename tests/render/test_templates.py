"""Templates are found from an installed wheel's share/ directory, and rendering stays free of torch/vLLM."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from deploykit.render.common import template_dirs
from tests.vllm_harness import REPO


def test_repo_templates_are_found_first() -> None:
    assert template_dirs()[0] == REPO / "templates"


def test_an_installed_layout_is_found_without_the_repo(tmp_path: Path) -> None:
    """A wheel puts the templates under <prefix>/share/deploykit/templates and the package elsewhere."""
    prefix = tmp_path / "prefix"
    shutil.copytree(REPO / "templates", prefix / "share" / "deploykit" / "templates")
    package = tmp_path / "site-packages" / "deploykit"
    package.mkdir(parents=True)
    assert template_dirs(package_dir=package, prefix=prefix) == [prefix / "share" / "deploykit" / "templates"]
    assert template_dirs(package_dir=package, prefix=tmp_path / "empty") == []


def test_rendering_never_imports_torch_or_vllm(tmp_path: Path) -> None:
    code = f"""
import sys
from typer.testing import CliRunner
from deploykit.cli import app
for kind in ("systemd", "helm"):
    args = ["render", kind, "-p", "demo-cpu", "--out", r"{tmp_path}/" + kind]
    result = CliRunner().invoke(app, args)
    assert result.exit_code in (0, 2), result.output
heavy = sorted(m for m in ("torch", "vllm", "transformers") if m in sys.modules)
print("heavy:", heavy)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
    assert (tmp_path / "systemd" / "deploykit-demo-cpu.service").is_file()
