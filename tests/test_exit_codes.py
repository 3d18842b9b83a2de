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
        "HOLD": 6,
        "INTERRUPTED": 130,
    }
    assert len(set(codes.values())) == len(codes)  # no two names share a number
    assert set(exit_codes.MEANINGS) == set(codes.values())
    assert len(set(exit_codes.MEANINGS.values())) == len(codes)  # nor two numbers a meaning


def test_a_signal_status_is_the_shells() -> None:
    import signal

    assert exit_codes.for_signal(signal.SIGINT) == exit_codes.INTERRUPTED
    assert exit_codes.for_signal(signal.SIGTERM) == 143


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


# --- a status written as a number ------------------------------------------------------------------------
# Where a status is made: an exit call's argument (`sys.exit(N)`, `raise SystemExit(N)`, `os._exit(N)`,
# `typer.Exit(N)` or `code=N`, argparse's `parser.exit(N)`), what an entry function returns (a `main`, a
# function whose result an exit call takes, and what those return in turn, followed across deploykit's
# modules), and an `EXIT_X = N` constant. A number there, or one an expression is made with (`128 + signum`,
# `0 if ok else 1`), is a literal status; outside exit_codes.py every status is one of its names.

EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "SystemExit", "os._exit", "typer.Exit", "Exit"})
STATUS_KEYWORDS = frozenset({"code", "status"})


def _is_exit_call(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    name = ast.unparse(node.func)
    return name in EXIT_CALLS or name.endswith((".exit", "._exit", ".Exit"))


def _status_args(call: ast.Call) -> list[ast.expr]:
    return [*call.args[:1], *(k.value for k in call.keywords if k.arg in STATUS_KEYWORDS)]


def _literal(node: ast.AST) -> bool:
    """A number, or an expression made with one (`128 + n`, `0 if ok else 1`, `-1`)."""
    if isinstance(node, ast.Constant):
        return type(node.value) is int
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.BinOp):
        return _literal(node.left) or _literal(node.right)
    if isinstance(node, ast.IfExp):
        return _literal(node.body) or _literal(node.orelse)
    if isinstance(node, ast.BoolOp):
        return any(_literal(value) for value in node.values)
    return False


def _own_returns(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.Return]:
    """The function's own return statements (not those of a function or lambda defined inside it)."""
    found: list[ast.Return] = []
    todo: list[ast.AST] = list(function.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            found.append(node)
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            todo.extend(ast.iter_child_nodes(node))
    return found


class _Module:
    def __init__(self, name: str, path: Path, package: str) -> None:
        self.name, self.path = name, path
        self.tree = ast.parse(path.read_text(encoding="utf-8"))
        self.functions = {
            node.name: node
            for node in self.tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        self.imported: dict[str, str] = {}  # local name -> "module:function" or "module:" (a module)
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package:
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = f"{node.module}:{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == package and alias.asname:
                        self.imported[alias.asname] = f"{alias.name}:"

    def target(self, call: ast.expr, modules: dict[str, _Module]) -> tuple[str, str] | None:
        """The (module, function) a call names, when it is one of the package's top-level functions."""
        if not isinstance(call, ast.Call):
            return None
        func = call.func
        if isinstance(func, ast.Name):
            if func.id in self.functions:
                return self.name, func.id
            module, _, name = self.imported.get(func.id, ":").partition(":")
            return (module, name) if module in modules else None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            module, _, name = self.imported.get(func.value.id, ":").partition(":")
            as_module = f"{module}.{name}" if name else module
            return (as_module, func.attr) if as_module in modules else None
        return None


def literal_statuses(root: Path, package: str) -> list[str]:
    """Every place under `root` (the package `package`) where a status is written as a number."""
    modules: dict[str, _Module] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "exit_codes.py" or "_data" in path.parts:
            continue
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join((package, *parts[:-1]) if parts[-1] == "__init__" else (package, *parts))
        modules[name] = _Module(name, path, package)
    found: list[str] = []
    entries: list[tuple[str, str]] = []

    def where(module: _Module, node: ast.AST) -> str:
        return f"{module.path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)}"

    for module in modules.values():
        entries += [(module.name, n) for n in module.functions if n == "main" or n.endswith("_main")]
        for node in ast.walk(module.tree):
            if _is_exit_call(node):
                assert isinstance(node, ast.Call)
                for status in _status_args(node):
                    if _literal(status):
                        found.append(where(module, node))
                    elif (target := module.target(status, modules)) is not None:
                        entries.append(target)
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets = [node.target]
            value = getattr(node, "value", None)
            named = [t.id for t in targets if isinstance(t, ast.Name) and "EXIT" in t.id.upper()]
            if named and value is not None and _literal(value):
                found.append(where(module, node))
    seen: set[tuple[str, str]] = set()
    while entries:
        entry = entries.pop()
        if entry in seen or entry[0] not in modules or entry[1] not in modules[entry[0]].functions:
            continue
        seen.add(entry)
        module = modules[entry[0]]
        for returned in _own_returns(module.functions[entry[1]]):
            if returned.value is None:
                continue
            if _literal(returned.value):
                found.append(where(module, returned) + f" (in {entry[1]}, an entry point's status)")
            elif (target := module.target(returned.value, modules)) is not None:
                entries.append(target)
    return sorted(set(found))


def test_no_module_writes_its_own_exit_number() -> None:
    """The numbers are written once, in exit_codes.py; everywhere else names them."""
    assert literal_statuses(PACKAGE, "deploykit") == []


PLANTED = {
    "__init__.py": "",
    "exit_codes.py": "OK = 0\nFAILED = 1\n",
    "direct.py": "import os, sys\ndef a():\n    sys.exit(3)\ndef b():\n    os._exit(1)\n",
    "raised.py": "def a():\n    raise SystemExit(2)\n",
    "typer_exit.py": (
        "import typer\ndef a():\n    raise typer.Exit(code=4)\ndef b():\n    raise typer.Exit(5)\n"
    ),
    "constant.py": "EXIT_BAD = 9\nEXIT_TYPED: int = 7\n",
    "entry.py": "import sys\ndef main():\n    return 0 if ok() else 1\n\nsys.exit(main())\n",
    "signal.py": "def helper(n):\n    return 128 + n\n",
    "cli.py": (
        "import typer\nfrom plant.signal import helper\nfrom plant import exit_codes\n"
        "def run():\n    return helper(2)\ndef command():\n    raise typer.Exit(run())\n"
    ),
    "argv.py": "def check(parser):\n    parser.exit(2)\n",
    "named.py": (
        "import sys\nfrom plant import exit_codes\n"
        "def main():\n    return exit_codes.OK\n"
        "def count():\n    return 3  # not a status: nothing exits with it\n"
        "sys.exit(main())\n"
    ),
}


def test_the_scan_finds_a_planted_literal_of_every_kind(tmp_path: Path) -> None:
    """Each way a number can become a status, planted in a throw-away package: each is found, and the
    same code with the names is not."""
    root = tmp_path / "plant"
    root.mkdir()
    for name, text in PLANTED.items():
        (root / name).write_text(text, encoding="utf-8")
    found = literal_statuses(root, "plant")
    for expected in (
        "plant/direct.py:3: sys.exit(3)",
        "plant/direct.py:5: os._exit(1)",
        "plant/raised.py:2: SystemExit(2)",
        "plant/typer_exit.py:3: typer.Exit(code=4)",
        "plant/typer_exit.py:5: typer.Exit(5)",
        "plant/constant.py:1: EXIT_BAD = 9",
        "plant/constant.py:2: EXIT_TYPED: int = 7",
        "plant/entry.py:3: return 0 if ok() else 1 (in main, an entry point's status)",
        "plant/signal.py:2: return 128 + n (in helper, an entry point's status)",
        "plant/argv.py:2: parser.exit(2)",
    ):
        assert expected in found, (expected, found)
    assert not [line for line in found if "named.py" in line or "exit_codes.py" in line], found
    assert len(found) == 10
