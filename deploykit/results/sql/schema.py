"""The store's schema and how a store gets there: the tables as of each version, the migrations (the
compatibility line, `schema_migrations`) and the additions (`schema_additions`: what the previous release
reads and writes through unharmed), applied under a lock so two processes opening a fresh store at once
cannot both migrate it. SQLite and PostgreSQL differ here only where a branch on `conn.dialect` says so.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple

from deploykit.errors import StoreError
from deploykit.net import redact_url

if TYPE_CHECKING:
    import sqlalchemy as sa

# Any constant works; it names "deploykit migrations" among the database's advisory locks.
_PG_MIGRATION_LOCK = 0x6465706C6F79


def results_table(metadata: sa.MetaData, *, schema_version: int | None = None) -> sa.Table:
    """The results table as of `schema_version` (default: the newest, with every addition); migrations
    build on older shapes."""
    import sqlalchemy as sa

    newest = schema_version is None
    version = SCHEMA_VERSION if schema_version is None else schema_version
    added_later = [sa.Column("fixes_active", sa.JSON)] if version >= 3 else []
    if version >= 4:
        added_later += [sa.Column("fingerprint", sa.JSON), sa.Column("fingerprint_key", sa.String(64))]
    if newest:  # the additions (ADDITIONS): nullable, so the previous release's inserts still fit
        added_later += [sa.Column("row_uuid", sa.String(32)), sa.Column("gate", sa.JSON)]
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


def baselines_table(metadata: sa.MetaData) -> sa.Table:
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
def tables() -> _Tables:
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
        results=results_table(metadata),
        migrations=migrations,
        baselines=baselines_table(metadata),
        additions=additions,
    )


if TYPE_CHECKING:
    RESULTS: sa.Table
    MIGRATIONS_TABLE: sa.Table
else:

    def __getattr__(name: str) -> Any:
        """`RESULTS` and `MIGRATIONS_TABLE`, the newest schema's tables, built on first access."""
        if name == "RESULTS":
            return tables().results
        if name == "MIGRATIONS_TABLE":
            return tables().migrations
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    apply: Callable[[sa.Connection], None]


def _create_results(conn: sa.Connection) -> None:
    import sqlalchemy as sa

    results_table(sa.MetaData(), schema_version=1).create(conn)


def _index_for_listing(conn: sa.Connection) -> None:
    import sqlalchemy as sa

    table = results_table(sa.MetaData(), schema_version=1)
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
    results = results_table(sa.MetaData(), schema_version=4)
    sa.Index("ix_results_fingerprint_key", results.c.fingerprint_key).create(conn)
    baselines = baselines_table(sa.MetaData())
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

    results = results_table(sa.MetaData(), schema_version=1)
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


def _add_gate_reports(conn: sa.Connection) -> None:
    """`deploykit gate`'s report with its row. Rows stored before it, and every other command's, have NULL;
    the previous release never selects the column and reads a gate row as one of an unknown command."""
    import sqlalchemy as sa

    json_type = sa.JSON().compile(dialect=conn.dialect)
    conn.exec_driver_sql(f"ALTER TABLE results ADD COLUMN gate {json_type}")


ADDITIONS: tuple[Addition, ...] = (
    Addition(1, "row_uuid: each attempt's own id, unique (a replayed row is written once)", _add_row_uuid),
    Addition(2, "profile_name and base_url as TEXT", _widen_inputs),
    Addition(3, "passwords older versions kept in base_url scrubbed", _scrub_base_url_passwords),
    Addition(4, "gate: the upgrade gate's report with its row", _add_gate_reports),
)


def applied_version(conn: sa.Connection) -> int:
    import sqlalchemy as sa

    migrations_table = tables().migrations
    if not sa.inspect(conn).has_table(migrations_table.name):
        return 0
    value = conn.execute(sa.select(sa.func.max(migrations_table.c.version))).scalar()
    return int(value or 0)


def applied_additions(conn: sa.Connection) -> set[int]:
    import sqlalchemy as sa

    additions = tables().additions
    if not sa.inspect(conn).has_table(additions.name):
        return set()
    return {int(number) for number in conn.execute(sa.select(additions.c.number)).scalars()}


def refuse_newer(current: int, where: str) -> None:
    if current > SCHEMA_VERSION:
        raise StoreError(
            f"the store at {where} has schema version {current}, newer than this deploykit knows "
            f"({SCHEMA_VERSION}): a breaking change; upgrade deploykit (docs/serve.md, Upgrading a fleet)",
            spoolable=False,
        )


@functools.cache
def column_limits() -> dict[str, int]:
    """The results columns with a length limit, and the limit (the inputs a person chooses have none)."""
    import sqlalchemy as sa

    return {
        column.name: int(column.type.length)
        for column in tables().results.columns
        if isinstance(column.type, sa.String) and not isinstance(column.type, sa.Text) and column.type.length
    }


def migrate(conn: sa.Connection, where: str, up_to: int | None = None) -> list[int]:
    """Apply the missing migrations (all, or up to `up_to`) and then the missing additions, in `conn`'s
    transaction; returns the migration versions applied now. `where`: the store, for a refusal's message."""
    import sqlalchemy as sa

    found = tables()
    applied: list[int] = []
    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
    found.migrations.create(conn, checkfirst=True)
    current = applied_version(conn)
    refuse_newer(current, where)
    for migration in MIGRATIONS:
        if migration.version <= current or (up_to is not None and migration.version > up_to):
            continue
        migration.apply(conn)
        conn.execute(
            sa.insert(found.migrations).values(
                version=migration.version, description=migration.description, applied_at=datetime.now(UTC)
            )
        )
        applied.append(migration.version)
    if up_to is None:
        found.additions.create(conn, checkfirst=True)
        done = applied_additions(conn)
        for addition in ADDITIONS:
            if addition.number in done:
                continue
            addition.apply(conn)
            conn.execute(
                sa.insert(found.additions).values(
                    number=addition.number, description=addition.description, applied_at=datetime.now(UTC)
                )
            )
    return applied
