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
import json
import socket
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from deploykit import errors
from deploykit.files import create_private_file, make_private_dirs
from deploykit.net import redact_url, redact_urls_in
from deploykit.paths import STORE_ENV_VAR, default_store_url
from deploykit.smoke import CaseResult
from deploykit.smoke.fingerprint import Fingerprint

if TYPE_CHECKING:
    import sqlalchemy as sa

# Any constant works; it names "deploykit migrations" among the database's advisory locks.
_PG_MIGRATION_LOCK = 0x6465706C6F79

Verdict = Literal["pass", "fail", "error", "interrupted", "unreadable"]
"""`unreadable` is never written: the reader gives it to a row it cannot read (see `_record`)."""
Command = Literal["serve", "smoke", "canary", "trace", "unknown"]
"""`unknown` is never written: an unreadable row whose command this deploykit does not know."""
UNREADABLE: Verdict = "unreadable"
_PG_CONNECT_TIMEOUT_S = 10  # a store host that does not answer ends in a spooled row, not a hang
_ROW_ID_MAX = 2**63 - 1  # SQLite INTEGER and PostgreSQL BIGINT: no row has a larger id


class ResultRecord(BaseModel):
    """One attempt. Secrets never reach it: env values are `${NAME}` references, logs are redacted."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = None
    row_uuid: str | None = Field(
        default_factory=lambda: uuid.uuid4().hex,
        pattern=r"^[0-9a-f]{32}$",  # also a spool file's name: nothing else may reach a path
        description="this attempt's own id, unique in the store: a spooled row replayed twice is written "
        "once (None: a row an older deploykit wrote)",
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    command: Command = "serve"
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
    fingerprint: Fingerprint | None = Field(
        default=None, description="the probe set's answers, their key and the comparison with its baseline"
    )

    @field_validator("base_url")
    @classmethod
    def _no_password(cls, url: str | None) -> str | None:
        """A URL given with `user:pw@` or `?password=` is stored (and so printed) without the secret."""
        return None if url is None else redact_url(url)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def unreadable(self) -> bool:
        """A row this deploykit could not read: its id and time are real, its diagnosis says why."""
        return self.verdict == UNREADABLE


class StoreError(errors.StoreError, RuntimeError):
    """`spoolable`: the row may yet be written to this store (it is away, full, locked): keep it in the
    spool (deploykit.spool). False where it never will be (no SQLAlchemy, not a URL, an in-memory store)."""

    def __init__(self, message: str, *, spoolable: bool = True) -> None:
        super().__init__(message)
        self.spoolable = spoolable


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
            errors.missing_package_message("sqlalchemy", "the results store", NO_STORE), spoolable=False
        ) from None


def check_store_url(url: str) -> None:
    """Refuse an empty --store (an in-memory SQLite store is refused once parsed: `_sqlite_engine`)."""
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


def _parse_url(url: str) -> sa.URL:
    require_sqlalchemy()
    import sqlalchemy as sa

    try:
        return sa.engine.make_url(normalise_url(url))
    except (sa.exc.ArgumentError, ValueError) as exc:
        raise StoreError(
            f"the store URL {display_url(url)} is not a URL ({redact_urls_in(str(exc))}); use {SUPPORTED}",
            spoolable=False,
        ) from None


def display_url(url: str) -> str:
    """The URL as given (a bare path as the sqlite:/// URL it becomes), passwords hidden: for messages,
    the terminal and stored rows. `deploykit.net.redact_url` is the one redactor."""
    return redact_url(url if "://" in url or not url else normalise_url(url))


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
        path = Path(_parse_url(url).database or "")
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


# --- schema -----------------------------------------------------------------------------------------


def _results_table(metadata: sa.MetaData, *, schema_version: int | None = None) -> sa.Table:
    """The results table as of `schema_version` (default: the newest, with every addition); migrations
    build on older shapes."""
    import sqlalchemy as sa

    newest = schema_version is None
    version = SCHEMA_VERSION if schema_version is None else schema_version
    added_later = [sa.Column("fixes_active", sa.JSON)] if version >= 3 else []
    if version >= 4:
        added_later += [sa.Column("fingerprint", sa.JSON), sa.Column("fingerprint_key", sa.String(64))]
    if newest:  # the additions (ADDITIONS): nullable, so the previous release's inserts still fit
        added_later += [sa.Column("row_uuid", sa.String(32))]
    # The inputs a person chooses (a profile's name, a URL) have no length limit: TEXT since addition 2.
    input_type: Callable[[int], Any] = (lambda _n: sa.Text) if newest else sa.String
    return sa.Table(
        "results",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("command", sa.String(16), nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("profile_name", input_type(200)),
        sa.Column("profile_id", sa.String(64)),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("stage", sa.String(32), nullable=False),
        sa.Column("diagnosis", sa.Text, nullable=False),
        sa.Column("base_url", input_type(500)),
        sa.Column("facts", sa.JSON),
        sa.Column("plan", sa.JSON),
        sa.Column("versions", sa.JSON, nullable=False),
        sa.Column("timings", sa.JSON, nullable=False),
        sa.Column("cases", sa.JSON, nullable=False),
        sa.Column("log_path", sa.Text),
        sa.Column("log_tail", sa.Text, nullable=False),
        *added_later,
    )


def _baselines_table(metadata: sa.MetaData) -> sa.Table:
    """One row per baseline a key has had; at most one `active` per key (written under the key's lock)."""
    import sqlalchemy as sa

    return sa.Table(
        "baselines",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("key_parts", sa.JSON, nullable=False),
        sa.Column("result_id", sa.Integer, nullable=False),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("pinned", sa.Boolean, nullable=False),
        sa.Column("confirmed_by", sa.String(255)),
        sa.Column("confirmed_at", sa.DateTime(timezone=True)),
        sa.Column("retired_at", sa.DateTime(timezone=True)),
        sa.Column("note", sa.Text, nullable=False),
    )


class _Tables(NamedTuple):
    results: sa.Table
    migrations: sa.Table
    baselines: sa.Table
    additions: sa.Table


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
    additions = sa.Table(
        "schema_additions",
        metadata,
        sa.Column("number", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("description", sa.String(200), nullable=False),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=False),
    )
    return _Tables(
        results=_results_table(metadata),
        migrations=migrations,
        baselines=_baselines_table(metadata),
        additions=additions,
    )


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


def _add_fingerprints(conn: sa.Connection) -> None:
    """The fingerprint with each row, its key indexed, and the baselines table. Rows stored before it have
    NULL: no fingerprint was taken."""
    import sqlalchemy as sa

    json_type = sa.JSON().compile(dialect=conn.dialect)
    key_type = sa.String(64).compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE results ADD COLUMN fingerprint {json_type}")
    conn.exec_driver_sql(f"ALTER TABLE results ADD COLUMN fingerprint_key {key_type}")
    results = _results_table(sa.MetaData(), schema_version=4)
    sa.Index("ix_results_fingerprint_key", results.c.fingerprint_key).create(conn)
    baselines = _baselines_table(sa.MetaData())
    baselines.create(conn)
    sa.Index("ix_baselines_key_status", baselines.c.key, baselines.c.status).create(conn)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "results table", _create_results),
    Migration(2, "indexes for listing by time and profile", _index_for_listing),
    Migration(3, "fixes active on the server (GET /deploykit/status)", _add_fixes_active),
    Migration(4, "fingerprints with each row, and the baselines of their keys", _add_fingerprints),
)
SCHEMA_VERSION = MIGRATIONS[-1].version
"""The store's compatibility line (`schema_migrations`). A release refuses a store whose line is newer than
its own, so a number here is added only for a breaking change: one the previous release could not read or
write. Everything additive is an ADDITION instead (docs/serve.md, "Upgrading a fleet")."""


def _add_row_uuid(conn: sa.Connection) -> None:
    """Each attempt's own id, unique: replaying a spooled row twice writes it once. Rows written before
    (and by the previous release, which does not know the column) have NULL, which a unique index allows
    any number of times."""
    import sqlalchemy as sa

    key_type = sa.String(32).compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE results ADD COLUMN row_uuid {key_type}")
    conn.exec_driver_sql("CREATE UNIQUE INDEX ux_results_row_uuid ON results (row_uuid)")


def _widen_inputs(conn: sa.Connection) -> None:
    """profile_name and base_url as TEXT: a profile's name and a URL have no length limit, so a row is
    never refused for one after the work is done. PostgreSQL only (SQLite never enforced the lengths);
    VARCHAR to TEXT rewrites nothing."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            "ALTER TABLE results ALTER COLUMN profile_name TYPE TEXT, ALTER COLUMN base_url TYPE TEXT"
        )


def _scrub_base_url_passwords(conn: sa.Connection) -> None:
    """Passwords older deploykits wrote into base_url (before the redactor) removed from the database,
    not only hidden when read."""
    import sqlalchemy as sa

    results = _results_table(sa.MetaData(), schema_version=1)
    pattern = sa.or_(results.c.base_url.like("%@%"), sa.func.lower(results.c.base_url).like("%password%"))
    rows = conn.execute(sa.select(results.c.id, results.c.base_url).where(pattern)).all()
    for row_id, url in rows:
        scrubbed = redact_url(url)
        if scrubbed != url:
            conn.execute(sa.update(results).where(results.c.id == row_id).values(base_url=scrubbed))


@dataclass(frozen=True)
class Addition:
    """A change the previous release reads and writes through unharmed: a nullable column, a table, an
    index, a wider type, a data fix. Recorded in `schema_additions`, never in `schema_migrations`, so the
    compatibility line (SCHEMA_VERSION) does not move and no host of a rolling upgrade is locked out."""

    number: int
    description: str
    apply: Callable[[sa.Connection], None]


ADDITIONS: tuple[Addition, ...] = (
    Addition(1, "row_uuid: each attempt's own id, unique (a replayed row is written once)", _add_row_uuid),
    Addition(2, "profile_name and base_url as TEXT", _widen_inputs),
    Addition(3, "passwords older versions kept in base_url scrubbed", _scrub_base_url_passwords),
)


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
    parsed = _parse_url(url)  # a StoreError naming SQLAlchemy when it is not installed
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


def validated_row(record: ResultRecord) -> dict[str, Any]:
    """The row as inserted, checked first: it reads back as this record (a value the reader would call
    unreadable is refused now, naming its field) and every value fits its column (on every back-end, so a
    row SQLite keeps would fit PostgreSQL too)."""
    row = record.model_dump(mode="json", exclude={"id"})
    try:
        ResultRecord.model_validate({**row, "created_at": record.created_at})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the row"
        raise StoreError(
            f"the row would not read back ({where}: {first['msg']}); it is not written: a deploykit bug, "
            "please report it",
            spoolable=False,
        ) from None
    row["created_at"] = record.created_at
    row["fingerprint_key"] = record.fingerprint.key if record.fingerprint is not None else None
    for name, limit in column_limits().items():
        value = row.get(name)
        if isinstance(value, str) and len(value) > limit:
            raise StoreError(
                f"{name} is {len(value)} characters; the results store holds at most {limit}",
                spoolable=False,
            )
    return row


@functools.cache
def column_limits() -> dict[str, int]:
    """The results columns with a length limit, and the limit (the inputs a person chooses have none)."""
    import sqlalchemy as sa

    return {
        column.name: int(column.type.length)
        for column in _tables().results.columns
        if isinstance(column.type, sa.String) and not isinstance(column.type, sa.Text) and column.type.length
    }


def check_fits(store: Store | None = None, **values: str | None) -> None:
    """Values a row will hold, checked against the store's limits before any work: one line naming the
    field and the limit (a `UsageError`), not a row refused once the work is done."""
    del store  # the limits are the schema's, the same on every back-end
    limits = column_limits()
    for name, value in values.items():
        limit = limits.get(name)
        if value is not None and limit is not None and len(value) > limit:
            raise errors.UsageError(
                f"{name} is {len(value)} characters; the results store holds at most {limit}: shorten it"
            )


def _recheck_new(conn: sa.Connection, record: ResultRecord, fingerprint: Fingerprint) -> None:
    """A fingerprint compared while its key had no baseline (`new`), written after another host's run made
    one: compared again with that baseline, under the key's lock, before the row is written; the row's
    verdict follows (two replicas that compared at once are never both `new`)."""
    comparison = fingerprint.comparison
    if comparison is None or comparison.verdict != "new":
        return
    active = _active(conn, fingerprint.key)
    if active is None:
        return
    import sqlalchemy as sa

    from deploykit.baseline_judge import CASE_NAME, judge_against

    results = _tables().results
    cell = conn.execute(
        sa.select(sa.type_coerce(results.c.fingerprint, sa.Text)).where(results.c.id == active["result_id"])
    ).scalar()
    baseline = _baseline({**active, "fingerprint": cell})
    fingerprint.comparison = again = judge_against(fingerprint, baseline, None, record.hostname)
    agrees = again.verdict in ("new", "match", "decides", "unchecked")
    for case in record.cases:
        if case.name == CASE_NAME:
            case.passed = case.passed and agrees
            case.diagnosis = "" if agrees else again.diagnosis
            case.text = again.diagnosis[:200] if agrees else case.text
    if not agrees and record.verdict == "pass":
        record.verdict, record.diagnosis = "fail", f"{CASE_NAME}: {again.diagnosis}"


class Store:
    """Open with `open_store(url)`; the schema is current once it returns (a read-only store is read as it
    is). `replayed`: spooled rows this process wrote when it opened the store (deploykit.spool)."""

    def __init__(self, engine: sa.Engine, url: str) -> None:
        self.engine = engine
        self.url = url
        self.replayed = 0
        self._columns: frozenset[str] | None = None

    @property
    def display_url(self) -> str:
        return display_url(self.url)

    @property
    def read_only(self) -> bool:
        return self.engine in _READ_ONLY_ENGINES

    def close(self) -> None:
        self.engine.dispose()

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return _applied_version(conn)

    def additions(self) -> list[int]:
        """The additions applied to this store (ADDITIONS; a newer deploykit's among them)."""
        with self.engine.connect() as conn:
            return sorted(_applied_additions(conn))

    def check_readable(self) -> None:
        """A store this deploykit cannot read (a breaking schema line newer than its own) is refused."""
        with self.engine.connect() as conn:
            _refuse_newer(_applied_version(conn), self.display_url)

    def columns(self) -> frozenset[str]:
        """The results table's columns in this store: a reader selects only these (an old store opened
        read-only, unmigrated, lacks the newest)."""
        import sqlalchemy as sa

        if self._columns is None:
            with self.engine.connect() as conn:
                inspector = sa.inspect(conn)
                found = inspector.get_columns("results") if inspector.has_table("results") else []
            self._columns = frozenset(str(column["name"]) for column in found)
        return self._columns

    def migrate(self, up_to: int | None = None) -> list[int]:
        """Apply the missing migrations (all, or up to `up_to`) and then the missing additions; returns the
        migration versions applied now."""
        import sqlalchemy as sa

        tables = _tables()
        applied: list[int] = []
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
            tables.migrations.create(conn, checkfirst=True)
            current = _applied_version(conn)
            _refuse_newer(current, self.display_url)
            for migration in MIGRATIONS:
                if migration.version <= current or (up_to is not None and migration.version > up_to):
                    continue
                migration.apply(conn)
                conn.execute(
                    sa.insert(tables.migrations).values(
                        version=migration.version,
                        description=migration.description,
                        applied_at=datetime.now(UTC),
                    )
                )
                applied.append(migration.version)
            if up_to is None:
                tables.additions.create(conn, checkfirst=True)
                done = _applied_additions(conn)
                for addition in ADDITIONS:
                    if addition.number in done:
                        continue
                    addition.apply(conn)
                    conn.execute(
                        sa.insert(tables.additions).values(
                            number=addition.number,
                            description=addition.description,
                            applied_at=datetime.now(UTC),
                        )
                    )
        self._columns = None
        return applied

    def add(self, record: ResultRecord) -> int:
        """Insert one attempt; returns its id. A read-only store refuses (the row is spooled). A row whose
        `row_uuid` is in the store already (a spooled row replayed twice, by two processes at once
        included) is not written again: its id is returned."""
        import sqlalchemy as sa

        if record.verdict == UNREADABLE or record.command == "unknown":
            raise StoreError("an unreadable row is never written back: store the attempt itself")
        row = validated_row(record)
        if self.read_only:
            raise StoreError(
                f"the results store {self.display_url} is read-only here: its row is not written"
            )
        results = _tables().results
        try:
            with store_errors(self.url, "write to"), self.engine.begin() as conn:
                if record.row_uuid is not None:
                    found = conn.execute(
                        sa.select(results.c.id).where(results.c.row_uuid == record.row_uuid)
                    ).scalar()
                    if found is not None:
                        return int(found)
                if record.fingerprint is not None:
                    _lock_key(conn, record.fingerprint.key)
                    _recheck_new(conn, record, record.fingerprint)
                    row = validated_row(record)
                result = conn.execute(sa.insert(results).values(**row).returning(results.c.id))
                row_id = int(result.scalar_one())
                if record.fingerprint is not None and record.passed:
                    _settle_baseline(conn, record, record.fingerprint, row_id)
                return row_id
        except StoreError:
            if record.row_uuid is None:
                raise
            existing = self._id_of(record.row_uuid)  # another process wrote it meanwhile (unique index)
            if existing is None:
                raise
            return existing

    def _id_of(self, row_uuid: str) -> int | None:
        import sqlalchemy as sa

        results = _tables().results
        try:
            with self.engine.connect() as conn:
                found = conn.execute(sa.select(results.c.id).where(results.c.row_uuid == row_uuid)).scalar()
        except sa.exc.SQLAlchemyError:
            return None
        return None if found is None else int(found)

    # --- baselines -------------------------------------------------------------------------------------

    def active_baseline(self, key: str) -> Baseline | None:
        """The baseline a fingerprint of `key` is compared with now, its row's fingerprint loaded."""
        found = self.baselines(key=key)
        return found[0] if found else None

    def baselines(self, key: str | None = None, *, include_retired: bool = False) -> list[Baseline]:
        """Baselines, newest first: the active ones (and the retired ones when asked), of one key or all."""
        import sqlalchemy as sa

        table, results = _tables().baselines, _tables().results
        query = (
            sa.select(table, sa.type_coerce(results.c.fingerprint, sa.Text).label("fingerprint"))
            .join(results, results.c.id == table.c.result_id, isouter=True)
            .order_by(table.c.id.desc())
        )
        if key is not None:
            query = query.where(table.c.key == key)
        if not include_retired:
            query = query.where(table.c.status == "active")
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            return [_baseline(row) for row in conn.execute(query).mappings()]

    def disputed(self, key: str, since_row: int, limit: int = 50) -> list[ResultRecord]:
        """Rows of `key` after `since_row` whose fingerprint disagreed with an unconfirmed baseline: the
        candidates a third replica may side with."""
        results = _tables().results
        query = (
            _raw_select(self.columns())
            .where(results.c.fingerprint_key == key, results.c.id > since_row)
            .order_by(results.c.id.desc())
            .limit(limit)
        )
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            rows = [_record(row) for row in conn.execute(query).mappings()]
        return [
            r
            for r in rows
            if r.fingerprint is not None
            and r.fingerprint.comparison is not None
            and r.fingerprint.comparison.verdict == "disputed"
        ]

    def pin_baseline(self, result_id: int, note: str = "") -> Baseline:
        """Make row `result_id`'s fingerprint the active, confirmed baseline of its key (an operator says)."""
        record = self.get(result_id)
        if record is None or record.fingerprint is None or not record.fingerprint.key:
            raise StoreError(
                f"row #{result_id} has no fingerprint to pin: pick a `serve` or `smoke` row with one "
                "(deploykit results list)"
            )
        fingerprint = record.fingerprint
        with store_errors(self.url, "write to"), self.engine.begin() as conn:
            _lock_key(conn, fingerprint.key)
            _retire_active(conn, fingerprint.key, f"replaced by a pin of row #{result_id}")
            pinned_id = _insert_baseline(
                conn, fingerprint, result_id, record.hostname, pinned=True, confirmed_by="operator", note=note
            )
        # This pin's own baseline, by its id: another pin of the key a moment later is its own message.
        return next(b for b in self.baselines(key=fingerprint.key, include_retired=True) if b.id == pinned_id)

    def retire_baseline(self, baseline_id: int, note: str = "retired by an operator") -> Baseline:
        """Retire one baseline; the key's next healthy run becomes its new baseline."""
        import sqlalchemy as sa

        table = _tables().baselines
        found = [b for b in self.baselines(include_retired=True) if b.id == baseline_id]
        if not found:
            raise StoreError(f"no baseline #{baseline_id}: see `deploykit results baseline show --all`")
        with store_errors(self.url, "write to"), self.engine.begin() as conn:
            conn.execute(
                sa.update(table)
                .where(table.c.id == baseline_id, table.c.status == "active")
                .values(status="retired", retired_at=datetime.now(UTC), note=note)
            )
        return next(b for b in self.baselines(include_retired=True) if b.id == baseline_id)

    def get(self, result_id: int) -> ResultRecord | None:
        """The row with this id (None when there is none, an id past what SQL stores included); a row
        this deploykit cannot read comes back `unreadable`, never as an exception."""

        if not 1 <= result_id <= _ROW_ID_MAX:
            return None
        results = _tables().results
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            row = (
                conn.execute(_raw_select(self.columns()).where(results.c.id == result_id)).mappings().first()
            )
        return None if row is None else _record(row)

    def recent(self, limit: int = 20, profile: str | None = None) -> list[ResultRecord]:
        """The newest attempts first; a row this deploykit cannot read is in its place, `unreadable`."""

        results = _tables().results
        query = (
            _raw_select(self.columns()).order_by(results.c.id.desc()).limit(max(0, min(limit, _ROW_ID_MAX)))
        )
        if profile is not None:
            query = query.where(results.c.profile_name == profile)
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            return [_record(row) for row in conn.execute(query).mappings()]

    def count(self) -> int:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(_tables().results)).scalar_one())


class Baseline(BaseModel):
    """The fingerprint every run of one key is compared with: which row, from which host, since when."""

    model_config = ConfigDict(extra="forbid")

    id: int
    key: str
    key_parts: dict[str, Any]
    result_id: int
    hostname: str
    created_at: datetime
    status: Literal["active", "retired"]
    pinned: bool = False
    confirmed_by: str | None = Field(
        default=None, description="the other host (or `operator`) that agreed with it; None: provisional"
    )
    confirmed_at: datetime | None = None
    retired_at: datetime | None = None
    note: str = ""
    fingerprint: Fingerprint | None = None


def _baseline(row: Mapping[str, Any] | sa.RowMapping) -> Baseline:
    data = dict(row)
    for name in ("key_parts", "fingerprint"):
        if isinstance(data.get(name), str | bytes):
            data[name] = json.loads(data[name])
    for name in ("created_at", "confirmed_at", "retired_at"):
        if data.get(name) is not None:
            data[name] = _timestamp(data[name])
    return Baseline.model_validate(data)


def _lock_key(conn: sa.Connection, key: str) -> None:
    """Serialise baseline decisions of one key: PostgreSQL takes an advisory lock for the transaction;
    SQLite's writers are serialised already (BEGIN IMMEDIATE)."""
    import sqlalchemy as sa

    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(int(key[:15] or "0", 16))))


def _active(conn: sa.Connection, key: str) -> sa.RowMapping | None:
    import sqlalchemy as sa

    table = _tables().baselines
    query = sa.select(table).where(table.c.key == key, table.c.status == "active").order_by(table.c.id.desc())
    return conn.execute(query).mappings().first()


def _retire_active(conn: sa.Connection, key: str, note: str) -> None:
    import sqlalchemy as sa

    table = _tables().baselines
    conn.execute(
        sa.update(table)
        .where(table.c.key == key, table.c.status == "active")
        .values(status="retired", retired_at=datetime.now(UTC), note=note)
    )


def _insert_baseline(
    conn: sa.Connection,
    fingerprint: Fingerprint,
    result_id: int,
    hostname: str,
    *,
    pinned: bool = False,
    confirmed_by: str | None = None,
    note: str = "",
) -> int:
    import sqlalchemy as sa

    table = _tables().baselines
    now = datetime.now(UTC)
    inserted = conn.execute(
        sa.insert(table)
        .values(
            key=fingerprint.key,
            key_parts=fingerprint.key_parts,
            result_id=result_id,
            hostname=hostname,
            created_at=now,
            status="active",
            pinned=pinned,
            confirmed_by=confirmed_by,
            confirmed_at=now if confirmed_by else None,
            note=note,
        )
        .returning(table.c.id)
    )
    return int(inserted.scalar_one())


def _settle_baseline(
    conn: sa.Connection, record: ResultRecord, fingerprint: Fingerprint, row_id: int
) -> None:
    """A passing row's effect on its key's baseline, in the row's own transaction (under the key's lock):
    the first healthy run of a key becomes its baseline (provisional); a match from another host confirms
    it; a third host siding with a disputed candidate replaces a provisional baseline with that candidate."""
    import sqlalchemy as sa

    comparison = fingerprint.comparison
    verdict = comparison.verdict if comparison is not None else "new"
    active = _active(conn, fingerprint.key)
    if active is None:
        if verdict in ("new", "match"):
            _insert_baseline(
                conn, fingerprint, row_id, record.hostname, note="the first healthy run of its key"
            )
        return
    table = _tables().baselines
    if verdict == "match" and active["confirmed_by"] is None and active["hostname"] != record.hostname:
        conn.execute(
            sa.update(table)
            .where(table.c.id == active["id"])
            .values(confirmed_by=record.hostname, confirmed_at=datetime.now(UTC))
        )
    elif verdict == "decides" and comparison is not None and comparison.agrees_with_row is not None:
        results = _tables().results
        host = conn.execute(sa.select(results.c.hostname).where(results.c.id == comparison.agrees_with_row))
        candidate_host = str(host.scalar() or "?")
        _retire_active(
            conn,
            fingerprint.key,
            f"outvoted: rows #{comparison.agrees_with_row} ({candidate_host}) and #{row_id} "
            f"({record.hostname}) agree with each other, not with it",
        )
        _insert_baseline(
            conn,
            fingerprint,
            comparison.agrees_with_row,
            candidate_host,
            confirmed_by=record.hostname,
            note=f"decided by row #{row_id} ({record.hostname})",
        )


def _applied_version(conn: sa.Connection) -> int:
    import sqlalchemy as sa

    migrations_table = _tables().migrations
    if not sa.inspect(conn).has_table(migrations_table.name):
        return 0
    value = conn.execute(sa.select(sa.func.max(migrations_table.c.version))).scalar()
    return int(value or 0)


def _applied_additions(conn: sa.Connection) -> set[int]:
    import sqlalchemy as sa

    additions = _tables().additions
    if not sa.inspect(conn).has_table(additions.name):
        return set()
    return {int(number) for number in conn.execute(sa.select(additions.c.number)).scalars()}


def _refuse_newer(current: int, where: str) -> None:
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"the store at {where} has schema version {current}, newer than this deploykit knows "
            f"({SCHEMA_VERSION}): a breaking change; upgrade deploykit (docs/serve.md, Upgrading a fleet)",
            spoolable=False,
        )


def _raw_select(present: frozenset[str] | None = None) -> sa.Select[Any]:
    """Every column (of those `present` in the store), with JSON and time columns as the database's text:
    decoding them is `_record`'s job, row by row, so one cell a newer writer filled differently cannot
    fail the whole query."""
    import sqlalchemy as sa

    results = _tables().results
    return sa.select(
        *(
            sa.type_coerce(column, sa.Text).label(column.name)
            if isinstance(column.type, sa.JSON | sa.DateTime)
            else column
            for column in results.columns
            if present is None or column.name in present
        )
    )


def _record(row: sa.RowMapping) -> ResultRecord:
    """One stored row as a record; a row that does not decode or validate (a verdict, command or JSON
    a newer deploykit wrote) is an `unreadable` record saying why, so the rows around it still show."""
    import sqlalchemy as sa

    data = dict(row)
    data.pop("fingerprint_key", None)
    data.setdefault("row_uuid", None)  # a store opened read-only before addition 1
    try:
        data["created_at"] = _timestamp(data["created_at"])
        for column in _tables().results.columns:
            if isinstance(column.type, sa.JSON) and isinstance(data.get(column.name), str | bytes):
                try:
                    data[column.name] = json.loads(data[column.name])
                except ValueError as exc:
                    raise ValueError(f"{column.name} is not JSON ({exc})") from None
        return ResultRecord.model_validate(data)
    except (ValueError, TypeError, ValidationError) as exc:
        return _unreadable(data, exc)


def _timestamp(value: Any) -> datetime:
    """A stored time in UTC: SQLite keeps text without an offset (we always write UTC); PostgreSQL
    answers a datetime in the session's zone."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"created_at {value[:40]!r} is not a time") from None
    if not isinstance(value, datetime):
        raise ValueError(f"created_at {str(value)[:40]!r} is not a time")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _unreadable(data: dict[str, Any], exc: Exception) -> ResultRecord:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the row"
        got = first.get("input")
        if first["type"] in ("literal_error", "enum"):
            why = f"{where} {str(got)[:60]!r} is not one this deploykit knows"
        else:
            why = f"{where}: {first['msg']}" + (f" (got {str(got)[:60]!r})" if isinstance(got, str) else "")
    else:
        why = " ".join(str(exc).split())[:200]
    try:
        created = _timestamp(data.get("created_at"))
    except (ValueError, TypeError):
        created = datetime.fromtimestamp(0, UTC)
    command = data.get("command")
    known = command in ("serve", "smoke", "canary", "trace")
    profile = data.get("profile_name")
    row_uuid = data.get("row_uuid")
    return ResultRecord(
        id=data.get("id") if isinstance(data.get("id"), int) else None,
        row_uuid=row_uuid if isinstance(row_uuid, str) else None,
        created_at=created,
        command=command if known else "unknown",
        hostname=str(data.get("hostname") or "?"),
        profile_name=profile if isinstance(profile, str) else None,
        verdict=UNREADABLE,
        stage=UNREADABLE,
        diagnosis=f"this deploykit cannot read the row ({why}); a newer deploykit may have written it: "
        "read it with that version",
    )


def open_store(url: str | None = None, *, migrate: bool = True) -> Store:
    """Open (creating when needed) the store at `url`, default `default_store_url()`."""
    require_sqlalchemy()
    if url is not None:
        check_store_url(url)
    try:
        chosen = url or default_store_url()
    except errors.MissingPackageError as exc:  # no platformdirs: where the default store goes is unknown
        raise StoreError(f"{exc.message}, or {NO_STORE}", spoolable=False) from None
    check_store_url(chosen)
    store = Store(create_store_engine(chosen), chosen)
    try:
        with store_errors(chosen, "open"):
            if store.read_only:
                store.check_readable()
            elif migrate:
                store.migrate()
        if migrate and not store.read_only:
            from deploykit.spool import replay

            store.replayed = replay(store)
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
