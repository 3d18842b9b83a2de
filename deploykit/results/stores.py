"""Which store a URL names, opened: the one place a command gets its `Store`. Every URL names the SQL store
today (SQLite or PostgreSQL, deploykit.results.sql); another kind of store implements
`deploykit.results.store.Store` and is one more branch here, and no command that uses a store changes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from deploykit.results.sql.store import open_store as open_sql_store
from deploykit.results.store import Store


def open_store(url: str | None = None, *, warn: Callable[[str], None] | None = None) -> Store:
    """Open (creating and migrating when needed) the store at `url`, default the user's (`$DEPLOYKIT_STORE`,
    else SQLite in the user data directory), and write the rows spooled for it first (`warn`: where a spool
    file set aside is said, default stderr). A `StoreError` when it cannot be opened, `spoolable` when a
    row for it may be kept to write later."""
    return open_sql_store(url, warn=warn)


@contextmanager
def opened_store(url: str | None = None) -> Iterator[Store]:
    """`open_store`, closed when the block ends."""
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()
