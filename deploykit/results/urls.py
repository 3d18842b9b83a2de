"""A results store's URL as a person gives it (`--store`, `$DEPLOYKIT_STORE`, a bare file path), as the
store's driver needs it, and as it is shown (passwords hidden). No SQLAlchemy: the spool keys its folders by
these without opening a store."""

from __future__ import annotations

from pathlib import Path

from deploykit.errors import StoreError
from deploykit.net import redact_url
from deploykit.paths import STORE_ENV_VAR

SUPPORTED = "SQLite (sqlite:///PATH, or a bare file path) or PostgreSQL (postgresql://USER@HOST/DB)"
POSTGRES_EXTRA = "pip install 'vllm-deploykit[postgres]'"
NO_STORE = "(smoke, canary) pass --no-store"


def check_store_url(url: str) -> None:
    """Refuse an empty --store (an in-memory SQLite store is refused once parsed: `sql.engine`)."""
    if not url.strip():
        raise StoreError(
            f"--store {url!r} names no store: give {SUPPORTED}, or leave --store out for the default "
            f"(${STORE_ENV_VAR}, else SQLite in the user data directory)",
            spoolable=False,
        )


def normalise_url(url: str) -> str:
    """Accept plain `postgresql://` (psql style) and bare file paths; SQLAlchemy needs the driver named."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def display_url(url: str) -> str:
    """The URL as given (a bare path as the sqlite:/// URL it becomes), passwords hidden: for messages,
    the terminal and stored rows. `deploykit.net.redact_url` is the one redactor."""
    return redact_url(url if "://" in url or not url else normalise_url(url))
