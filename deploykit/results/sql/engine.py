"""A store's engine, per dialect: SQLite as an owner-only file in WAL mode whose writers queue (or a file
this process may only read, opened immutable), PostgreSQL with a connect timeout; anything else refused."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.errors import StoreError
from deploykit.files import create_private_file, make_private_dirs
from deploykit.results.sql.errors import parse_url
from deploykit.results.urls import POSTGRES_EXTRA, SUPPORTED, display_url

if TYPE_CHECKING:
    import sqlalchemy as sa

_PG_CONNECT_TIMEOUT_S = 10  # a store host that does not answer ends in a spooled row, not a hang


def _create_owner_only(database: str) -> None:
    """The SQLite file and a directory made for it are the owner's alone (0600, 0700): results hold argv,
    env names and log tails. SQLite gives its -wal and -shm files the database file's permissions."""
    path = Path(database)
    make_private_dirs(path.parent)
    create_private_file(path)


def _sqlite_engine(url: sa.URL, given: str) -> sa.Engine:
    import sqlalchemy as sa

    database = url.database or ""
    if database == "" or ":memory:" in database or url.query.get("mode") == "memory":
        raise StoreError(
            f"the store {display_url(given)} is an in-memory SQLite database: its rows vanish when "
            "deploykit exits; give a file, sqlite:///PATH, or pass --no-store (smoke, canary) to keep none",
            spoolable=False,
        )
    if url.query.get("mode") == "ro" or _read_only_file(Path(database)):
        if not Path(database).is_file():
            raise StoreError(f"the read-only store {display_url(given)} does not exist", spoolable=False)
        return _read_only_sqlite_engine(Path(database))
    try:
        _create_owner_only(database)
    except OSError as exc:
        raise StoreError(
            f"cannot create the results store {display_url(given)}: {exc.strerror} ({exc.filename}); "
            "pass --store sqlite:///PATH (or set $DEPLOYKIT_STORE) to a writable location"
        ) from None
    engine = sa.create_engine(url, connect_args={"timeout": 60})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event start transactions, not pysqlite's implicit BEGIN.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # Take the write lock up front: two writers queue on busy_timeout instead of failing mid-way.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


_READ_ONLY_ENGINES: weakref.WeakSet[sa.Engine] = weakref.WeakSet()


def _read_only_file(path: Path) -> bool:
    """A store file that exists where this process cannot write (read-only media, a colleague's copy), or
    one named `sqlite:///PATH?mode=ro`: it can be read, never written, migrated or given its WAL's -shm."""
    import os

    return path.is_file() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK))


def _read_only_sqlite_engine(path: Path) -> sa.Engine:
    """`immutable=1`: SQLite reads the file as it is, without the -shm a WAL database needs and cannot
    create on read-only media (a -wal file left beside it is not read: only a checkpointed store shows
    all its rows)."""
    import sqlite3
    from urllib.parse import quote

    import sqlalchemy as sa

    uri = f"file:{quote(str(path))}?mode=ro&immutable=1"

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(uri, uri=True, timeout=60, check_same_thread=False)
        connection.isolation_level = None
        return connection

    engine = sa.create_engine("sqlite://", creator=connect)
    _READ_ONLY_ENGINES.add(engine)
    return engine


def create_store_engine(url: str) -> sa.Engine:
    parsed = parse_url(url)  # a StoreError naming SQLAlchemy when it is not installed
    import sqlalchemy as sa

    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, url)
    if backend == "postgresql":
        try:
            timeout = {} if "connect_timeout" in parsed.query else {"connect_timeout": _PG_CONNECT_TIMEOUT_S}
            return sa.create_engine(parsed, pool_pre_ping=True, connect_args=timeout)
        except ImportError as exc:
            raise StoreError(
                f"the store {display_url(url)} needs the PostgreSQL driver psycopg, which is not installed "
                f"({exc}): {POSTGRES_EXTRA}"
            ) from None
    raise StoreError(
        f"unsupported store URL {display_url(url)} ({backend}): deploykit stores in {SUPPORTED}",
        spoolable=False,
    )


def is_read_only(engine: sa.Engine) -> bool:
    """An engine on a store file this process may only read (`_read_only_sqlite_engine`)."""
    return engine in _READ_ONLY_ENGINES
