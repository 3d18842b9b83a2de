"""The package has no import circle (issue 45: `canary/runner.py` and `canary/loop.py` imported each other).

Every import counts — at module level, inside a function, under `TYPE_CHECKING` — since each one ties the
two modules' designs together; only importing one's own parent package (which Python does anyway to reach
a submodule) is not an edge. Read from the source with `ast`: nothing is imported to check it.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "deploykit"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.Module, name: str, is_package: bool) -> set[str]:
    """Every `deploykit...` name the module's import statements mention (a `from X import a` mentions X
    and X.a, which is a submodule or a name in X)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return {each for each in names if each == "deploykit" or each.startswith("deploykit.")}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for path in PACKAGE.rglob("*.py")}

    def owner(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {owner(each) for each in imported(tree, name, path.name == "__init__.py")}
        parents = {name.rsplit(".", depth)[0] for depth in range(1, name.count(".") + 1)}
        graph[name] = {each for each in targets if each is not None and each != name and each not in parents}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_package_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_the_check_finds_a_circle_like_the_canarys_old_one() -> None:
    """runner.py imported loop.py inside a method, loop.py imported runner.py under TYPE_CHECKING."""
    graph = {
        "deploykit.canary.runner": {"deploykit.canary.loop", "deploykit.canary.state"},
        "deploykit.canary.loop": {"deploykit.canary.runner"},
        "deploykit.canary.state": set(),
    }
    assert circles(graph) == [["deploykit.canary.loop", "deploykit.canary.runner"]]
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from deploykit.canary.runner import C\n"
    )
    assert imported(tree, "deploykit.canary.loop", False) == {
        "deploykit.canary.runner",
        "deploykit.canary.runner.C",
    }
