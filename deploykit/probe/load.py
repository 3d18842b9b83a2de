"""GPU facts as validated models: a live probe of this machine, or a saved probe file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deploykit import errors
from deploykit.installed import installed_version
from deploykit.probe.facts import ProbeFacts
from deploykit.probe.nvml_reader import FACTS_SCHEMA_VERSION as SCHEMA_VERSION
from deploykit.probe.nvml_reader import read_probe_document


class ProbeError(errors.FactsError):
    """A saved facts file could not be used."""


def probe(
    nvml: Any | None = None, *, package_version: Callable[[str], str | None] = installed_version
) -> ProbeFacts:
    """Probe every GPU (see `read_probe_document`); never raises for NVML trouble."""
    return ProbeFacts.model_validate(read_probe_document(nvml, package_version=package_version))


def load_facts(path: str) -> ProbeFacts:
    """A saved `deploykit probe --save FILE`, so a deployment for another machine can be planned anywhere."""
    import json
    from pathlib import Path

    from pydantic import ValidationError

    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ProbeError(f"{path}: cannot read the facts file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ProbeError(
            f"{path}: not a deploykit probe file: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at "
            f"offset {exc.start}); write one with `deploykit probe --save FILE` on the target"
        ) from None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ProbeError(
            f"{path}: not a deploykit probe file: not JSON ({exc}); write one with "
            "`deploykit probe --save FILE` on the target"
        ) from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise ProbeError(
            f"{path}: facts schema_version {version!r} is not one this deploykit reads ({SCHEMA_VERSION}); "
            "save them again with `deploykit probe --save FILE` from this deploykit version"
        )
    try:
        facts = ProbeFacts.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ProbeError(f"{path}: not a deploykit probe file: {where}: {first['msg']}") from None
    facts.source = str(file)
    return facts
