"""The store every results test opens: one per test, on SQLite and on the real PostgreSQL of
tools/ci-services.sh (a fresh schema, dropped afterwards)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from deploykit.results.sql.store import SqlStore, open_store
from tests.serve_helpers import BACKENDS, fresh_store_url


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of a store that does not exist yet, once per back-end."""
    with fresh_store_url(request.param, tmp_path) as url:
        yield url


@pytest.fixture()
def store(store_url: str) -> Iterator[SqlStore]:
    """The store at `store_url`, opened (so migrated), closed afterwards."""
    opened = open_store(store_url)
    yield opened
    opened.close()
