"""The one build step pyproject.toml cannot say: ship the top-level profiles/ and templates/ as package data.

They stay at the top of the repository (the project's design card); a wheel holds them as
`deploykit/_data/profiles` and `deploykit/_data/templates`, where `deploykit.paths` reads them through
importlib.resources in every install mode. An editable install reads the repository's folders directly.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_DATA = ("profiles", "templates")  # deploykit.paths.SHIPPED_DATA


class BuildPyWithData(build_py):
    """build_py, then a copy of each shipped folder into the built package's _data/."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's folders
        for name in SHIPPED_DATA:
            for source in sorted((ROOT / name).rglob("*")):
                if source.is_file() and "__pycache__" not in source.parts:
                    target = Path(self.build_lib, "deploykit", "_data", name, source.relative_to(ROOT / name))
                    self.mkpath(str(target.parent))
                    self.copy_file(str(source), str(target))


setup(cmdclass={"build_py": BuildPyWithData})
