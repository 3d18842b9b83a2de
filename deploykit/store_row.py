"""One row into the results store, the last step of every command that stores one (`serve`, its restarts,
`smoke`, `trace`, the canary): a store that fails at that point (disk full, server gone) is a warning,
never a lost verdict or a stopped canary.

A command that must not start work it cannot record opens its store first (`deploykit.store.open_store`,
a `StoreError` before any model loads) and hands the opened store here; a row written later (while
serving, by the canary) names the store by URL and it is opened for that row alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploykit.store import ResultRecord, Store


def store_row(
    record: ResultRecord,
    store: Store | str | None,
    warn: Callable[[str], None],
    *,
    what: str = "the result",
) -> tuple[int | None, str]:
    """Add `record` to `store` (an opened store, or a URL: None is the default store); returns the row's
    id and where it went. A store that cannot be opened or written is `warn("WHAT could not be stored:
    …")` and a None id."""
    from deploykit.net import redact_url
    from deploykit.store import StoreError, open_store

    if store is None or isinstance(store, str):
        try:
            opened = open_store(store)
        except StoreError as exc:
            warn(f"{what} could not be stored: {exc}")
            return None, redact_url(store) if store else "the results store"
        try:
            return _add(record, opened, warn, what)
        finally:
            opened.close()
    return _add(record, store, warn, what)


def _add(
    record: ResultRecord, store: Store, warn: Callable[[str], None], what: str
) -> tuple[int | None, str]:
    from deploykit.store import StoreError

    try:
        return store.add(record), store.display_url
    except StoreError as exc:
        warn(f"{what} could not be stored: {exc}")
        return None, store.display_url
