"""What deploykit knows of each supported vLLM release, shipped as package data: one JSON per release.

Each file (`vllm-<release>.json`, written by tools/vllm_tables.py from that release's own code) holds
- `option_table`: its `vllm serve` parser as deploykit.vllm_args describes it, so a plan is checked against
  the parser of the vLLM it targets, not the one (if any) installed where it is made;
- `env_vars`: the names its `vllm/envs.py` defines (read with `ast`, never imported);
- `source_facts`: facts about its source that decisions need (deploykit.fixes read them by name).

Nothing here imports vLLM; a file is read once per process (~1 ms).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

# The releases a table is shipped for; tests/test_vllm_options.py holds this to the files in this folder
# and to the tested range (deploykit.vllm_compat.TESTED_VLLM).
SUPPORTED_VLLM_RELEASES: tuple[str, ...] = ("0.32.0", "0.33.0")
SHIPPED_SCHEMA = 1  # the shape of a release file around its option table (which carries its own schema)


def release_of(version: str | None) -> str | None:
    """The supported release `version` is, its local label aside: `0.32.0+cpu` → `0.32.0`; None for any
    other release (`0.32.1`, `0.34.0`) or an unreadable version."""
    if not version:
        return None
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)(?:\+[A-Za-z0-9.]+)?\s*$", version)
    if match is None:
        return None
    parts = [int(p) for p in match.group(1).split(".")]
    while len(parts) < 3:
        parts.append(0)
    for release in SUPPORTED_VLLM_RELEASES:
        if [int(p) for p in release.split(".")] == parts:
            return release
    return None


def file_name(release: str) -> str:
    return f"vllm-{release}.json"


@functools.cache
def _read(release: str) -> dict[str, Any]:
    text = resources.files(__name__).joinpath(file_name(release)).read_text(encoding="utf-8")
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("shipped_schema") != SHIPPED_SCHEMA:
        raise ValueError(f"deploykit/vllm_tables/{file_name(release)} is not a schema {SHIPPED_SCHEMA} file")
    return data


def shipped_release(version: str | None) -> dict[str, Any] | None:
    """The shipped file of the release `version` is, or None when none is shipped for it."""
    release = release_of(version)
    return None if release is None else _read(release)


def shipped_option_table(version: str | None) -> dict[str, Any] | None:
    data = shipped_release(version)
    return None if data is None else dict(data["option_table"])


def shipped_env_vars(version: str | None) -> frozenset[str] | None:
    data = shipped_release(version)
    return None if data is None else frozenset(data["env_vars"])


def shipped_source_facts(version: str | None) -> dict[str, Any] | None:
    data = shipped_release(version)
    return None if data is None else dict(data["source_facts"])
