"""GPU facts as validated models: a live probe of this machine, or a saved probe file."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deploykit import errors
from deploykit.installed import installed_version
from deploykit.probe.facts import ProbeFacts
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

    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ProbeError(f"{path}: cannot read the facts file: {exc.strerror}") from exc
    try:
        facts = ProbeFacts.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ProbeError(f"{path}: not a deploykit probe file: {where}: {first['msg']}") from exc
    facts.source = str(file)
    return facts
