"""The pod's plugin wheel leaves out the commands nothing in a pod runs (plugin_wheel.POD_LEFT_OUT_COMMANDS):
the command line registers the commands whose modules are there, and a command module that fails for any
other reason (a dependency it lacks) still fails loudly."""

from __future__ import annotations

import subprocess
import sys

from deploykit.render.plugin_wheel import POD_LEFT_OUT_COMMANDS

BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in {modules!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name={missing!r} or name)
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["deploykit", "--help"]
from deploykit.cli.app import main
main()
"""


def _help_without(modules: list[str], missing: str | None) -> subprocess.CompletedProcess[str]:
    """`deploykit --help` with `modules` not importable; the error names `missing` (None: the module)."""
    code = BLOCK.format(modules=modules, missing=missing)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_command_module_left_out_of_the_wheel_is_just_not_listed() -> None:
    left_out = [f"deploykit.cli.{name}" for name in POD_LEFT_OUT_COMMANDS]
    done = _help_without(left_out, None)
    assert done.returncode == 0, done.stderr
    commands = {
        line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ") and line.split()
    }
    assert not commands & set(POD_LEFT_OUT_COMMANDS)
    assert {"canary", "smoke", "gate", "probe", "plan"} <= commands  # what a pod runs


def test_a_command_module_whose_own_import_fails_still_fails() -> None:
    done = _help_without(["deploykit.cli.render"], "yaml")  # its module is there; something it needs is not
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr
