"""SQLAlchemy and driver failures as one `StoreError` line: no SQLAlchemy at all (the vLLM image), a URL
that is not one, a full disk, a driver's several-line error (any URL in it redacted)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from deploykit import errors
from deploykit.errors import StoreError
from deploykit.net import redact_urls_in
from deploykit.paths import STORE_ENV_VAR
from deploykit.results.urls import NO_STORE, SUPPORTED, display_url, normalise_url

if TYPE_CHECKING:
    import sqlalchemy as sa


def require_sqlalchemy() -> None:
    """Every way into a store starts here: without SQLAlchemy (the vLLM image has none), a StoreError that
    names it, not an ImportError from deep inside."""
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        raise StoreError(
            errors.missing_package_message("sqlalchemy", "the results store", NO_STORE), spoolable=False
        ) from None


def parse_url(url: str) -> sa.URL:
    require_sqlalchemy()
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(normalise_url(url))
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StoreError(
            f"the store URL {display_url(url)} is not a URL ({redact_urls_in(str(exc))}); use {SUPPORTED}",
            spoolable=False,
        ) from None


def _one_line(error: BaseException | None) -> str:
    """A driver's error (psycopg's span several lines) as one line, any URL in it redacted."""
    return redact_urls_in(" ".join(str(error).split())) or type(error).__name__


_FULL_BELOW_BYTES = 1 << 20


def _disk_full(url: str, error: BaseException | None) -> str:
    """SQLite's answer on a full disk ("database or disk is full", or "disk I/O error" when the WAL cannot
    grow) as what it is: the disk holding the store is full. Empty when that is not the cause."""
    import shutil

    text = str(error)
    if "disk is full" not in text and "disk I/O error" not in text:
        return ""
    try:
        path = Path(parse_url(url).database or "")
        free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    except (StoreError, OSError):
        return ""
    if "disk is full" not in text and free >= _FULL_BELOW_BYTES:
        return ""
    limit = "" if free < _FULL_BELOW_BYTES else ", or the store file may grow no further (a size limit)"
    return (
        f"the disk holding {path.parent} is full ({free // 1024} KiB free there{limit}): free space, or "
        f"point --store (${STORE_ENV_VAR}) at another disk"
    )


@contextmanager
def store_errors(url: str, doing: str) -> Iterator[None]:
    """SQLAlchemy and driver errors while `doing` something with the store at `url`, as one StoreError."""
    import sqlalchemy as sa

    try:
        yield
    except StoreError:
        raise
    except (
        sa.exc.DataError
    ) as exc:  # this row's values, refused whenever they are sent: keeping it helps none
        raise StoreError(
            f"cannot {doing} the results store {display_url(url)}: it refuses a value of the row "
            f"({_one_line(exc.orig)})",
            spoolable=False,
        ) from None
    except sa.exc.DBAPIError as exc:
        full = _disk_full(url, exc.orig)
        if full:
            raise StoreError(f"cannot {doing} the results store {display_url(url)}: {full}") from None
        raise StoreError(
            f"cannot {doing} the results store {display_url(url)}: {_one_line(exc.orig)}; "
            f"check the store (--store or ${STORE_ENV_VAR}) or point it at a new {SUPPORTED}"
        ) from None
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"cannot {doing} the results store {display_url(url)}: {_one_line(exc)}") from None
