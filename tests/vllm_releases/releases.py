"""Which vLLM release this process imports, and the environment that imports another one.

The tier (tests/vllm_releases) runs its checks in this process against the installed vLLM (0.32, the CPU
build) and, for every other supported release, in a child pytest whose `import vllm` gives that release's
Python sources (tools/fetch-vllm-sources.sh, tools/vllm_tables.py's release_env).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from deploykit.installed import installed_vllm_version
from deploykit.vllm_tables import release_of

REPO = Path(__file__).resolve().parents[2]
CHILD_PLUGIN = "tests.vllm_releases.child_plugin"  # 0.34's x86-without-Triton refusal (its docstring)
CHILD_ENV = "DEPLOYKIT_RELEASE_TIER_CHILD"  # set in a child run: it must not start children of its own


def tables_tool() -> ModuleType:
    """tools/vllm_tables.py, loaded as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location(
        "deploykit_tools_vllm_tables", REPO / "tools" / "vllm_tables.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


def importable_release() -> str | None:
    return release_of(installed_vllm_version())


def vllm_root() -> Path:
    """The folder that holds the importable `vllm/` package (located, not imported)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))).parent


def in_child() -> bool:
    return os.environ.get(CHILD_ENV) == "1"


def next_release() -> str:
    """The release after the newest one deploykit ships a table for (0.35.0 while 0.34.0 is the newest):
    the tests' "not known, outside the range" version, so adding a release edits none of them."""
    from deploykit.vllm_tables import NEWEST_KNOWN_RELEASE

    major, minor, _ = (int(part) for part in NEWEST_KNOWN_RELEASE.split("."))
    return f"{major}.{minor + 1}.0"


NEXT_RELEASE = next_release()
