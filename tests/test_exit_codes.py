"""Exit codes live in one module, each number means one thing, and docs/exit-codes.md says the same."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import deploykit
from deploykit import errors, exit_codes

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(deploykit.__file__).parent
DOC = REPO / "docs" / "exit-codes.md"
# `| 4 | `NO_GPU` | probe found no NVIDIA GPU | ... |`
EXITS = ("sys.exit", "typer.Exit", "SystemExit", "os._exit")
ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*`([A-Z_]+)`\s*\|\s*([^|]+?)\s*\|")


def module_codes() -> dict[str, int]:
    return {
        name: value
        for name, value in vars(exit_codes).items()
        if name.isupper() and type(value) is int and not name.startswith("_")
    }


def test_each_number_has_one_meaning() -> None:
    codes = module_codes()
    assert codes == {
        "OK": 0,
        "FAILED": 1,
        "USAGE": 2,
        "CORRUPT": 3,
        "NO_GPU": 4,
        "HUNG": 5,
        "INTERRUPTED": 130,
    }
    assert len(set(codes.values())) == len(codes)  # no two names share a number
    assert set(exit_codes.MEANINGS) == set(codes.values())
    assert len(set(exit_codes.MEANINGS.values())) == len(codes)  # nor two numbers a meaning


def test_the_doc_table_is_the_module() -> None:
    rows = [ROW.match(line) for line in DOC.read_text(encoding="utf-8").splitlines()]
    table = {(int(m[1]), m[2], m[3]) for m in rows if m}
    assert table == {(value, name, exit_codes.MEANINGS[value]) for name, value in module_codes().items()}


def test_the_readme_links_the_table() -> None:
    assert "docs/exit-codes.md" in (REPO / "README.md").read_text(encoding="utf-8")


def test_every_error_family_exits_with_a_listed_code() -> None:
    families: list[type[errors.DeploykitError]] = [errors.DeploykitError]
    for family in families:
        families.extend(family.__subclasses__())
    assert len(families) > 5
    for family in families:
        assert family.exit_code in exit_codes.MEANINGS, family


def _literal_exit_codes(path: Path) -> list[str]:
    """`EXIT_X = 3`, `sys.exit(3)`, `typer.Exit(3)`: a number written where a name belongs."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name) and "EXIT" in t.id]
            if names and type(node.value.value) is int:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {names[0]} = {node.value.value}")
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = ast.unparse(node.func)
            if function in EXITS and type(node.args[0].value) is int:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {function}({node.args[0].value})")
    return found


def test_no_module_writes_its_own_exit_number() -> None:
    """The numbers are written once, in exit_codes.py; everywhere else names them."""
    found = [
        line
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "exit_codes.py" and "_data" not in path.parts
        for line in _literal_exit_codes(path)
    ]
    assert found == []
