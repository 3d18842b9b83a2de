"""What deploykit knows of each supported vLLM release, shipped as package data: one JSON per release.

Each file (`vllm-<release>.json`, written by tools/vllm_tables.py from that release's own code) holds
- `option_table`: its `vllm serve` parser as deploykit.vllm_args describes it, so a plan is checked against
  the parser of the vLLM it targets, not the one (if any) installed where it is made;
- `env_vars`: the names its `vllm/envs.py` defines (read with `ast`, never imported);
- `source_facts`: facts about its source that decisions need (deploykit.fixes read them by name);
- `flashinfer_pin`: the FlashInfer its wheel pins (`Requires-Dist: flashinfer-python==X` in its METADATA),
  as the metadata spells it; null where the metadata pins none (0.32's CPU build).

Nothing here imports vLLM; a file is read once per process (~1 ms).
"""

from __future__ import annotations

import functools
import json
import re
from importlib import resources
from typing import Any

SHIPPED_SCHEMA = 2  # the shape of a release file around its option table (which carries its own schema);
# 2 added `flashinfer_pin`
_FILE = re.compile(r"^vllm-(\d+\.\d+\.\d+)\.json$")


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(part) for part in release.split("."))


def _shipped_files() -> tuple[str, ...]:
    """The releases whose file is in this folder, oldest first: adding a release is adding its file
    (`make vllm-release VERSION=X` writes it), never editing a list."""
    names = (entry.name for entry in resources.files(__name__).iterdir())
    found = (match.group(1) for match in map(_FILE.match, names) if match)
    return tuple(sorted(found, key=_release_key))


# The releases a table is shipped for, oldest first; tests/test_vllm_compat.py holds this to the tested
# range (deploykit.vllm_compat.TESTED_VLLM).
SUPPORTED_VLLM_RELEASES: tuple[str, ...] = _shipped_files()
NEWEST_KNOWN_RELEASE: str = SUPPORTED_VLLM_RELEASES[-1]


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


def newer_than_known(version: str | None) -> bool:
    """True when `version` is a release after every shipped one (`0.35.0` while 0.34.0 is the newest):
    nothing about it has been read; plans use the newest table and say so."""
    from deploykit.vllm_compat import parse_version

    parsed = parse_version(version)
    return parsed is not None and parsed > parse_version(NEWEST_KNOWN_RELEASE)  # type: ignore[operator]


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
    """None too where the table is not carried: the chart's plugin wheel leaves option tables out
    (deploykit.render.plugin_wheel), and nothing in a pod checks an argv."""
    data = shipped_release(version)
    table = None if data is None else data.get("option_table")
    return None if table is None else dict(table)


def shipped_env_vars(version: str | None) -> frozenset[str] | None:
    data = shipped_release(version)
    return None if data is None else frozenset(data["env_vars"])


def shipped_source_facts(version: str | None) -> dict[str, Any] | None:
    data = shipped_release(version)
    return None if data is None else dict(data["source_facts"])


_OLDER_PINS_FILE = "flashinfer-pins.json"


@functools.cache
def _older_pins() -> dict[str, Any]:
    """The pins of releases older than the tables (tools/flashinfer_pins.py writes them from PyPI)."""
    data = json.loads(resources.files(__name__).joinpath(_OLDER_PINS_FILE).read_text(encoding="utf-8"))
    return dict(data["pins"])


def _wheel_pin(version: str | None) -> str | None:
    from deploykit.vllm_compat import is_cpu_build, parse_version

    if is_cpu_build(version):
        return None  # the CPU build's metadata names no FlashInfer
    parsed = parse_version(version)
    entry = _older_pins().get(".".join(map(str, parsed[:3]))) if parsed else None
    return None if entry is None else entry["flashinfer"]


def flashinfer_pin(version: str | None) -> str | None:
    """The FlashInfer version the CUDA wheel of `version`'s release pins (`0.34.0` → `0.7.3`, `0.25.1` →
    `0.6.13`): its table's, else the record of the wheels the tables do not pin (older releases, and 0.32,
    whose table the CPU build wrote: it names none); None when neither knows the release."""
    data = shipped_release(version)
    if data is None or data["flashinfer_pin"] is None:
        return _wheel_pin(version)
    pin = data["flashinfer_pin"]
    if pin is None or isinstance(pin, str):
        return pin
    raise ValueError(
        f"deploykit/vllm_tables/{file_name(data['release'])}: flashinfer_pin {pin!r} is not a string"
    )
