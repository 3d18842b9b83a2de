"""The shipped advisory catalog: package data read with importlib.resources, validated once per process."""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml
from pydantic import ValidationError

from deploykit import errors
from deploykit.advisories.schema import Advisory, Catalog

CATALOG_FILE = "catalog.yaml"


class CatalogError(errors.DeploykitError):
    """The shipped catalog does not validate: a broken install or a bad edit of catalog.yaml."""


@cache
def load_catalog() -> Catalog:
    text = resources.files("deploykit.advisories").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    try:
        return Catalog.model_validate(yaml.safe_load(text))
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
