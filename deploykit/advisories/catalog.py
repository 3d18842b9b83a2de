"""The shipped advisory catalog, validated once per process: one entry per registered fix (its module's
ADVISORY, its id and action derived from the registry, deploykit.fixes), then the package data
catalog.yaml (read with importlib.resources) for the workarounds and warnings."""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

import yaml
from pydantic import ValidationError

from deploykit import errors
from deploykit.advisories.schema import Advisory, Catalog
from deploykit.fixes import FIX_MODULES, FIX_NAMES, load_fix

# libyaml's safe loader where PyYAML was built with it (its wheels are): the catalog is read by every `plan`,
# and the pure-Python reader took ~55 ms of it, the C one ~6 ms. Same documents, same types.
SAFE_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CATALOG_FILE = "catalog.yaml"


class CatalogError(errors.DeploykitError):
    """The shipped catalog does not validate: a broken install or a bad edit of catalog.yaml."""


def fix_entry(name: str) -> dict[str, Any]:
    """A registered fix's catalog entry: its module's ADVISORY, with the id (the name with dashes) and the
    action (the fix, applied by default; `fixes.NAME` in a profile sets it) the registry gives."""
    why = f"deploykit's fix; `fixes.{name}` sets it"
    action = {"kind": "fix", "fix": name, "default": "apply", "why": why}
    return {"id": name.replace("_", "-"), **load_fix(name).ADVISORY, "action": action}


def _fix_advisories() -> list[Advisory]:
    entries = []
    for name in FIX_NAMES:
        try:
            entries.append(Advisory.model_validate(fix_entry(name)))
        except ValidationError as exc:
            error = exc.errors()[0]
            first = f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
            raise CatalogError(
                f"{FIX_MODULES[name]}.ADVISORY does not validate ({first}): fix the entry "
                "(format: docs/advisories.md)"
            ) from None
    return entries


@cache
def load_catalog() -> Catalog:
    text = resources.files("deploykit.advisories").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    try:
        shipped = Catalog.model_validate(yaml.load(text, Loader=SAFE_LOADER))
        return Catalog(advisories=[*_fix_advisories(), *shipped.advisories])  # ids unique across both
    except yaml.YAMLError as exc:
        raise CatalogError(
            f"deploykit/advisories/{CATALOG_FILE} is not YAML ({str(exc).splitlines()[0]}): "
            "reinstall deploykit"
        ) from None
    except ValidationError as exc:
        error = exc.errors()[0]
        first = f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
        raise CatalogError(
            f"deploykit/advisories/{CATALOG_FILE} does not validate ({first}): reinstall deploykit, or fix "
            "the entry (format: docs/advisories.md)"
        ) from None


def advisories() -> list[Advisory]:
    return load_catalog().advisories


def advisory_ids() -> list[str]:
    return [advisory.id for advisory in advisories()]
