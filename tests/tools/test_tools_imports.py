"""The tools (tools/*.py: `make vllm-release`, the tables, the docs index) import nothing from tests/: what a
tool and the tests both need lives in tools/ (or deploykit/), and the tests import it from there."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def imported_modules(source: str) -> list[str]:
    """Every module a file imports, at any depth (`import a.b`, `from a.b import c`, inside functions);
    `importlib.import_module("x")` and `__import__("x")` with a literal name too."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append(node.args[0].value)
    return found


def imports_tests(source: str) -> list[str]:
    return [name for name in imported_modules(source) if name == "tests" or name.startswith("tests.")]


def test_no_tool_imports_tests() -> None:
    tools = sorted((REPO / "tools").glob("*.py"))
    assert tools, "no tools/*.py found"
    offending = {
        str(path.relative_to(REPO)): found
        for path in tools
        if (found := imports_tests(path.read_text(encoding="utf-8")))
    }
    assert offending == {}, f"tools import from tests/ (move what they need into tools/): {offending}"


def test_the_check_sees_every_spelling() -> None:
    source = (
        "import tests\n"
        "import tests.vllm_releases.releases as r\n"
        "def f():\n"
        "    from tests.vllm_releases.releases import CHILD_ENV\n"
        "    importlib.import_module('tests.x')\n"
        "from testsuite import y\n"
        "from . import tests\n"
        "PLUGIN = 'tests.vllm_releases.child_plugin'\n"
    )
    assert sorted(imports_tests(source)) == [
        "tests",
        "tests.vllm_releases.releases",
        "tests.vllm_releases.releases",
        "tests.x",
    ]
