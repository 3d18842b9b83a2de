"""The results store: one row per `deploykit serve` / `deploykit smoke` attempt, whatever its outcome,
and `deploykit canary` rows (one per state change, an hourly heartbeat).

SQLite in the user's data directory by default (WAL, so a reader never blocks a writer), or a PostgreSQL
URL when a team shares one store. The schema is versioned: `schema_migrations` lists the migrations
applied, and opening a store applies the missing ones under a lock, so two processes opening a fresh
store at once cannot both migrate it.

SQLAlchemy is imported only to open a store, never to import this module: `deploykit smoke --no-store` and
`deploykit canary --no-store` build `ResultRecord`s (the canary keeps its rows in memory) inside the vLLM
image, which has no SQLAlchemy. Storing there ends in one `StoreError` naming the package.
"""

from __future__ import annotations

import functools
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from deploykit import errors
from deploykit.paths import STORE_ENV_VAR, create_private_file, default_store_url, make_private_dirs
from deploykit.smoke import CaseResult

if TYPE_CHECKING:
    import sqlalchemy as sa

# Any constant works; it names "deploykit migrations" among the database's advisory locks.
_PG_MIGRATION_LOCK = 0x6465706C6F79

Verdict = Literal["pass", "fail", "error", "interrupted"]


class ResultRecord(BaseModel):
    """One attempt. Secrets never reach it: env values are `${NAME}` references, logs are redacted."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = None
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    command: Literal["serve", "smoke", "canary", "trace"] = "serve"
    hostname: str = Field(default_factory=socket.gethostname)
    profile_name: str | None = None
    profile_id: str | None = None
    verdict: Verdict
    stage: str = Field(description="where the attempt ended: profile, plan, launch, startup, smoke, done")
    diagnosis: str = ""
    base_url: str | None = None
    facts: dict[str, Any] | None = None
    plan: dict[str, Any] | None = Field(default=None, description="argv, env (redacted), fixes, model path")
    versions: dict[str, str | None] = Field(default_factory=dict)
    timings: dict[str, float | None] = Field(default_factory=dict)
    cases: list[CaseResult] = Field(default_factory=list)
    fixes_active: dict[str, str] | None = Field(
        default=None,
        description="fix → patched target as GET /deploykit/status reported them ({} when deploykit's "
        "plugin is not loaded); None when the server was not asked (the attempt ended earlier)",
    )
    log_path: str | None = None
    log_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


class StoreError(errors.StoreError, RuntimeError):
    pass


SUPPORTED = "SQLite (sqlite:///PATH, or a bare file path) or PostgreSQL (postgresql://USER@HOST/DB)"
POSTGRES_EXTRA = "pip install 'vllm-deploykit[postgres]'"
NO_STORE = "(smoke, canary) pass --no-store"


def require_sqlalchemy() -> None:
    """Every way into a store starts here: without SQLAlchemy (the vLLM image has none), a StoreError that
    names it, not an ImportError from deep inside."""
    try:
        import sqlalchemy  # noqa: F401
    except ImportError:
        raise StoreError(
            errors.missing_package_message("sqlalchemy", "the results store", NO_STORE)
        ) from None


def normalise_url(url: str) -> str:
    """Accept plain `postgresql://` (psql style) and bare file paths; SQLAlchemy needs the driver named."""
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def _parse_url(url: str) -> sa.URL:
    require_sqlalchemy()
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(normalise_url(url))
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StoreError(f"the store URL {url!r} is not a URL ({exc}); use {SUPPORTED}") from None


def display_url(url: str) -> str:
    """The URL as given, with its password hidden, for messages and the terminal."""
    try:
        import sqlalchemy as sa
    except ImportError:
        return _display_url_without_sqlalchemy(url)
    try:
        given = url if "://" in url else normalise_url(url)
        return sa.engine.make_url(given).render_as_string(hide_password=True)
    except (sa.exc.ArgumentError, ValueError):
        return repr(url)


def _display_url_without_sqlalchemy(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return repr(url)
    if not password:
        return url
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{parts.username or ''}:***@{host}").geturl()


def _one_line(error: BaseException | None) -> str:
    """A driver's error (psycopg's span several lines) as one line."""
    return " ".join(str(error).split()) or type(error).__name__


@contextmanager
def store_errors(url: str, doing: str) -> Iterator[None]:
    """SQLAlchemy and driver errors while `doing` something with the store at `url`, as one StoreError."""
    import sqlalchemy as sa

    try:
        yield
    except StoreError:
        raise
    except sa.exc.DBAPIError as exc:
        raise StoreError(
            f"cannot {doing} the results store {display_url(url)}: {_one_line(exc.orig)}; "
            f"check the store (--store or ${STORE_ENV_VAR}) or point it at a new {SUPPORTED}"
        ) from None
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"cannot {doing} the results store {display_url(url)}: {_one_line(exc)}") from None


# --- schema -----------------------------------------------------------------------------------------


def _results_table(metadata: sa.MetaData, *, schema_version: int | None = None) -> sa.Table:
    """The results table as of `schema_version` (default: the newest); migrations build on older shapes."""
    import sqlalchemy as sa

    added_later = [sa.Column("fixes_active", sa.JSON)]  # migration 3
    return sa.Table(
        "results",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("command", sa.String(16), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("profile_name", sa.String(200)),
        sa.Column("profile_id", sa.String(64)),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("diagnosis", sa.Text, nullable=False),
        sa.Column("base_url", sa.String(500)),
        sa.Column("facts", sa.JSON),
        sa.Column("plan", sa.JSON),
        sa.Column("versions", sa.JSON, nullable=False),
        sa.Column("timings", sa.JSON, nullable=False),
        sa.Column("cases", sa.JSON, nullable=False),
        sa.Column("log_path", sa.Text),
        sa.Column("log_tail", sa.Text, nullable=False),
        *(added_later if schema_version is None or schema_version >= 3 else []),
    )


class _Tables(NamedTuple):
    results: sa.Table
    migrations: sa.Table


@functools.cache
def _tables() -> _Tables:
    """The newest schema's tables, built on first use (building them needs SQLAlchemy)."""
    import sqlalchemy as sa

    metadata = sa.MetaData()
    migrations = sa.Table(
        "schema_migrations",
        metadata,
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(200), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
    )
    return _Tables(results=_results_table(metadata), migrations=migrations)


if TYPE_CHECKING:
    RESULTS: sa.Table
    MIGRATIONS_TABLE: sa.Table
else:

    def __getattr__(name: str) -> Any:
        """`RESULTS` and `MIGRATIONS_TABLE`, the newest schema's tables, built on first access."""
        if name == "RESULTS":
            return _tables().results
        if name == "MIGRATIONS_TABLE":
            return _tables().migrations
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[sa.Connection], None]


def _create_results(conn: sa.Connection) -> None:
    import sqlalchemy as sa

    _results_table(sa.MetaData(), schema_version=1).create(conn)


def _index_for_listing(conn: sa.Connection) -> None:
    import sqlalchemy as sa

    table = _results_table(sa.MetaData(), schema_version=1)
    sa.Index("ix_results_created_at", table.c.created_at).create(conn)
    sa.Index("ix_results_profile", table.c.profile_name, table.c.profile_id).create(conn)


def _add_fixes_active(conn: sa.Connection) -> None:
    """Rows stored before it have NULL: the server was not asked which fixes were active."""
    import sqlalchemy as sa

    column_type = sa.JSON().compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE results ADD COLUMN fixes_active {column_type}")


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "results table", _create_results),
    Migration(2, "indexes for listing by time and profile", _index_for_listing),
    Migration(3, "fixes active on the server (GET /deploykit/status)", _add_fixes_active),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def _create_owner_only(database: str) -> None:
    """The SQLite file and a directory made for it are the owner's alone (0600, 0700): results hold argv,
    env names and log tails. SQLite gives its -wal and -shm files the database file's permissions."""
    path = Path(database)
    make_private_dirs(path.parent)
    create_private_file(path)


def _sqlite_engine(url: sa.URL, given: str) -> sa.Engine:
    import sqlalchemy as sa

    if url.database and url.database != ":memory:":
        try:
            _create_owner_only(url.database)
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


def create_store_engine(url: str) -> sa.Engine:
    parsed = _parse_url(url)  # a StoreError naming SQLAlchemy when it is not installed
    import sqlalchemy as sa

    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed, url)
    if backend == "postgresql":
        try:
            return sa.create_engine(parsed, pool_pre_ping=True)
        except ImportError as exc:
            raise StoreError(
                f"the store {display_url(url)} needs the PostgreSQL driver psycopg, which is not installed "
                f"({exc}): {POSTGRES_EXTRA}"
            ) from None
    raise StoreError(f"unsupported store URL {display_url(url)} ({backend}): deploykit stores in {SUPPORTED}")


class Store:
    """Open with `open_store(url)`; the schema is current once it returns."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        self.engine = engine
        self.url = url

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    def close(self) -> None:
        self.engine.dispose()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return _applied_version(conn)

    def migrate(self, up_to: int | None = None) -> list[int]:
        """Apply the missing migrations (all, or up to `up_to`); returns the versions applied now."""
        import sqlalchemy as sa

        migrations_table = _tables().migrations
        applied: list[int] = []
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
            migrations_table.create(conn, checkfirst=True)
            current = _applied_version(conn)
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"the store at {self.display_url} has schema version {current}, newer than this "
                    f"deploykit knows ({SCHEMA_VERSION}); upgrade deploykit"
                )
            for migration in MIGRATIONS:
                if migration.version <= current or (up_to is not None and migration.version > up_to):
                    continue
                migration.apply(conn)
                conn.execute(
                    sa.insert(migrations_table).values(
                        version=migration.version,
                        description=migration.description,
                        applied_at=datetime.now(UTC),
                    )
                )
                applied.append(migration.version)
        return applied

    def add(self, record: ResultRecord) -> int:
        """Insert one attempt; returns its id."""
        import sqlalchemy as sa

        results = _tables().results
        row = record.model_dump(mode="json", exclude={"id"})
        row["created_at"] = record.created_at
        with store_errors(self.url, "write to"), self.engine.begin() as conn:
            result = conn.execute(sa.insert(results).values(**row).returning(results.c.id))
            return int(result.scalar_one())

    def get(self, result_id: int) -> ResultRecord | None:
        import sqlalchemy as sa

        results = _tables().results
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            row = conn.execute(sa.select(results).where(results.c.id == result_id)).mappings().first()
        return None if row is None else _record(row)

    def recent(self, limit: int = 20, profile: str | None = None) -> list[ResultRecord]:
        """The newest attempts first."""
        import sqlalchemy as sa

        results = _tables().results
        query = sa.select(results).order_by(results.c.id.desc()).limit(limit)
        if profile is not None:
            query = query.where(results.c.profile_name == profile)
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            return [_record(row) for row in conn.execute(query).mappings()]

    def count(self) -> int:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_tables().results)).scalar_one())


def _applied_version(conn: sa.Connection) -> int:
    import sqlalchemy as sa

    migrations_table = _tables().migrations
    if not sa.inspect(conn).has_table(migrations_table.name):
        return 0
    value = conn.execute(sa.select(sa.func.max(migrations_table.c.version))).scalar()
    return int(value or 0)


def _record(row: sa.RowMapping) -> ResultRecord:
    data = dict(row)
    created = data["created_at"]
    if isinstance(created, datetime):
        # SQLite keeps no offset (we always write UTC); PostgreSQL answers in the session's zone.
        data["created_at"] = (
            created.replace(tzinfo=UTC) if created.tzinfo is None else created.astimezone(UTC)
        )
    return ResultRecord.model_validate(data)


def open_store(url: str | None = None, *, migrate: bool = True) -> Store:
    """Open (creating when needed) the store at `url`, default `default_store_url()`."""
    require_sqlalchemy()
    try:
        chosen = url or default_store_url()
    except errors.MissingPackageError as exc:  # no platformdirs: where the default store goes is unknown
        raise StoreError(f"{exc.message}, or {NO_STORE}") from None
    store = Store(create_store_engine(chosen), chosen)
    if migrate:
        try:
            with store_errors(chosen, "open"):
                store.migrate()
        except StoreError:
            store.close()
            raise
    return store


@contextmanager
def opened_store(url: str | None = None) -> Iterator[Store]:
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()
