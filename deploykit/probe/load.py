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
    from pathlib import Path

    from pydantic import ValidationError

    from deploykit.input_files import InputFileError, parse_json, read_text

    file = Path(path)
    way_out = "write one with `deploykit probe --save FILE` on the target"
    try:
        text = read_text(file)
    except FileNotFoundError:
        raise ProbeError(f"{path}: cannot read the facts file: no such file; {way_out}") from None
    except InputFileError as exc:
        raise ProbeError(f"{path}: not a deploykit probe file: {exc.reason}; {way_out}") from None
    try:
        raw = parse_json(text)
    except InputFileError as exc:
        raise ProbeError(f"{path}: not a deploykit probe file: {exc.reason}; {way_out}") from None
    if not isinstance(raw, dict):
        kinds = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
        kind = kinds.get(type(raw), "a number")
        raise ProbeError(
            f"{path}: not a deploykit probe file: the top level is {kind}, not an object with "
            f"schema_version and gpus; {way_out}"
        )
    version = raw.get("schema_version")
    if isinstance(version, str) and version.strip() == str(SCHEMA_VERSION):
        raise ProbeError(
            f"{path}: facts schema_version is the string {version!r}: write the number {SCHEMA_VERSION} "
            "(no quotes), or save them again with `deploykit probe --save FILE`"
        )
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ProbeError(
            f"{path}: facts schema_version {version!r} is not one this deploykit reads ({SCHEMA_VERSION}); "
            "save them again with `deploykit probe --save FILE` from this deploykit version"
        )
    try:
        facts = ProbeFacts.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        shown = first["type"] in ("string_pattern_mismatch", "not_a_version", "hidden_character")
        got = f" (got {str(first['input'])[:40]!r})" if shown else ""  # repr: a line break shows as \n
        raise ProbeError(f"{path}: not a deploykit probe file: {where}: {first['msg']}{got}") from None
    facts.source = str(file)
    return facts
