"""One error tree: each error class is defined once in the package (the stage families in deploykit.errors,
a module's own error as a subclass of its family), and every family is used."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import deploykit
from deploykit import errors

PACKAGE = Path(deploykit.__file__).parent


def _sources() -> dict[Path, str]:
    return {path: path.read_text(encoding="utf-8") for path in sorted(PACKAGE.rglob("*.py"))}


def test_each_error_class_is_defined_once() -> None:
    defined: dict[str, list[str]] = defaultdict(list)
    for path, text in _sources().items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                defined[node.name].append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert {name: places for name, places in defined.items() if len(places) > 1} == {}


def test_every_family_in_deploykit_errors_is_raised_or_subclassed_elsewhere() -> None:
    families = [
        name
        for name, value in vars(errors).items()
        if isinstance(value, type) and issubclass(value, errors.DeploykitError)
    ]
    assert len(families) > 5
    others = "\n".join(text for path, text in _sources().items() if path.name != "errors.py")
    unused = [name for name in families if not re.search(rf"\b{name}\b", others)]
    assert unused == []


def test_a_family_reexported_by_a_stage_is_the_same_class() -> None:
    """Where a stage module names its family (profile.schema.ProfileError, serve.launch.LaunchError, ...),
    it is deploykit.errors' own class, so `except errors.X` catches what the stage raises."""
    from deploykit.fixes import base
    from deploykit.profile import schema
    from deploykit.render import common
    from deploykit.serve import launch

    assert schema.ProfileError is errors.ProfileError and schema.ProfileIssue is errors.ProfileIssue
    assert launch.LaunchError is errors.LaunchError
    assert base.FixError is errors.FixError
    assert common.RenderError is errors.RenderError
