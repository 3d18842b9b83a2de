"""One row into the results store, the last step of every command that stores one (`serve`, its restarts,
`smoke`, `trace`, the canary). A store that fails at that point (the server gone, the disk full) never
loses the row: it is spooled (deploykit.results.spool) and written by the next command that reaches the
store; the command says so in one line and exits as its verdict says.

A command that must not start work it cannot record opens its store first (`open_store`, a `StoreError`
before any model loads) and hands the opened store here; a row written later (while serving, by the
canary) names the store by URL and it is opened for that row alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from deploykit.errors import StoreError

if TYPE_CHECKING:
    from deploykit.results.record import ResultRecord
    from deploykit.results.store import Store


def store_row(
    record: ResultRecord,
    store: Store | str | None,
    warn: Callable[[str], None],
    *,
    what: str = "the result",
) -> tuple[int | None, str]:
    """Add `record` to `store` (an opened store, or a URL: None is the default store); returns the row's
    id and where it went. A store that cannot take it now: the row spooled, one `warn` line, a None id."""
    from deploykit.results.stores import open_store

    if store is None or isinstance(store, str):
        try:
            opened = open_store(store, warn=warn)
        except StoreError as exc:
            return None, _spool(record, _url(store), exc, warn, what)
        try:
            return _add(record, opened, warn, what)
        finally:
            opened.close()
    return _add(record, store, warn, what)


def _url(store: str | None) -> str | None:
    """The store's URL (None is the default store's), None when not even that is known (no platformdirs)."""
    from deploykit import errors
    from deploykit.paths import default_store_url

    if store is not None:
        return store
    try:
        return default_store_url()
    except errors.MissingPackageError:
        return None


def _add(
    record: ResultRecord, store: Store, warn: Callable[[str], None], what: str
) -> tuple[int | None, str]:
    try:
        row_id = store.add(record)
    except StoreError as exc:
        return None, _spool(record, store.url, exc, warn, what)
    if store.replayed:
        warn(f"{store.replayed} row(s) spooled while the store was away written to {store.display_url} first")
        store.replayed = 0
    return row_id, store.display_url


def _spool(
    record: ResultRecord, url: str | None, exc: StoreError, warn: Callable[[str], None], what: str
) -> str:
    """Keep the row for the next command that reaches the store; one line either way."""
    from deploykit.net import redact_url
    from deploykit.results.spool import SpoolError, keep

    where = redact_url(url) if url else "the results store"
    if not exc.spoolable or url is None:
        warn(f"{what} could not be stored: {exc}")
        return where
    try:
        spooled = keep(record, url)
    except (SpoolError, OSError) as spool_error:
        warn(f"{what} could not be stored ({exc}) nor spooled ({spool_error}): it is lost")
        return where
    passed_over = "".join(f"; {refused}" for refused in spooled.refused)
    warn(
        f"{what} is not stored yet ({exc}); spooled in {spooled.path}, written when {where} is back"
        + passed_over
    )
    return where
