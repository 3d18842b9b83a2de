"""The SQL results store (SQLite in the user's data directory by default, WAL so a reader never blocks a
writer; or a PostgreSQL URL when a team shares one): `open_store` opens it, migrates it and writes the rows
spooled while it was away; `SqlStore` is the `deploykit.results.store.Store` it returns.

SQLAlchemy is imported only to open a store, never to import this module: without it (the vLLM image),
opening one is one `StoreError` naming the package.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from deploykit import errors
from deploykit.errors import StoreError
from deploykit.paths import default_store_url
from deploykit.results.baseline import Baseline
from deploykit.results.record import UNREADABLE, ResultRecord
from deploykit.results.sql import schema
from deploykit.results.sql.baselines import (
    baseline_from_row,
    disputed_rows,
    insert_baseline,
    lock_key,
    rejudge,
    retire_active,
    settle_baseline,
)
from deploykit.results.sql.engine import create_store_engine, is_read_only
from deploykit.results.sql.errors import require_sqlalchemy, store_errors
from deploykit.results.sql.rows import check_fits, decode_row, keep_nul_as_symbol, raw_select, validated_row
from deploykit.results.sql.schema import applied_additions, applied_version, refuse_newer, tables
from deploykit.results.urls import NO_STORE, check_store_url, display_url

if TYPE_CHECKING:
    import sqlalchemy as sa

_ROW_ID_MAX = 2**63 - 1  # SQLite INTEGER and PostgreSQL BIGINT: no row has a larger id


class SqlStore:
    """Open with `open_store(url)`; the schema is current once it returns (a read-only store is read as it
    is). `replayed`: spooled rows this process wrote when it opened the store (deploykit.results.spool)."""

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
        return is_read_only(self.engine)

    def close(self) -> None:
        self.engine.dispose()

    def check_fits(self, **values: str | None) -> None:
        check_fits(self, **values)

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            return applied_version(conn)

    def additions(self) -> list[int]:
        """The additions applied to this store (ADDITIONS; a newer deploykit's among them)."""
        with self.engine.connect() as conn:
            return sorted(applied_additions(conn))

    def check_readable(self) -> None:
        """A store this deploykit cannot read (a breaking schema line newer than its own) is refused."""
        with self.engine.connect() as conn:
            refuse_newer(applied_version(conn), self.display_url)

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
        with self.engine.begin() as conn:
            applied = schema.migrate(conn, self.display_url, up_to)
        self._columns = None
        return applied

    def add(self, record: ResultRecord) -> int:
        """Insert one attempt; returns its id. A read-only store refuses (the row is spooled). A row whose
        `row_uuid` is in the store already (a spooled row replayed twice, by two processes at once
        included) is not written again: its id is returned. A fingerprint's comparison is the store's own,
        judged again under the key's lock (`rejudge`): the row's verdict follows it, the baseline moves
        only by it. A NUL in a text field is kept as U+2400 (`keep_nul_as_symbol`: `record` changes)."""
        import sqlalchemy as sa

        if record.verdict == UNREADABLE or record.command == "unknown":
            raise StoreError(
                "an unreadable row is never written back: store the attempt itself", spoolable=False
            )
        keep_nul_as_symbol(record)
        row = validated_row(record)
        if self.read_only:
            raise StoreError(
                f"the results store {self.display_url} is read-only here: its row is not written"
            )
        results = tables().results
        present = self.columns() if record.fingerprint is not None else None
        try:
            with store_errors(self.url, "write to"), self.engine.begin() as conn:
                if record.row_uuid is not None:
                    found = conn.execute(
                        sa.select(results.c.id).where(results.c.row_uuid == record.row_uuid)
                    ).scalar()
                    if found is not None:
                        return int(found)
                judged = None
                if record.fingerprint is not None:
                    lock_key(conn, record.fingerprint.key)
                    judged = rejudge(conn, record, record.fingerprint, present)
                    row = validated_row(record)
                result = conn.execute(sa.insert(results).values(**row).returning(results.c.id))
                row_id = int(result.scalar_one())
                if record.fingerprint is not None and record.passed and record.command != "gate":
                    # A gate's candidate is judged like any row, but moves no baseline of its own accord:
                    # it becomes one only when a person adopts it (`gate --adopt`: `pin_baseline`).
                    settle_baseline(conn, record, record.fingerprint, judged, row_id)
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

        results = tables().results
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

        table, results = tables().baselines, tables().results
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
            return [baseline_from_row(row) for row in conn.execute(query).mappings()]

    def disputed(self, key: str, since_row: int, limit: int = 50) -> list[ResultRecord]:
        """Rows of `key` after `since_row` whose fingerprint disagreed with an unconfirmed baseline: the
        candidates a third replica may side with."""
        present = self.columns()
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            return disputed_rows(conn, key, since_row, limit, present)

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
            lock_key(conn, fingerprint.key)
            retire_active(conn, fingerprint.key, f"replaced by a pin of row #{result_id}")
            pinned_id = insert_baseline(
                conn, fingerprint, result_id, record.hostname, pinned=True, confirmed_by="operator", note=note
            )
        # This pin's own baseline, by its id: another pin of the key a moment later is its own message.
        return next(b for b in self.baselines(key=fingerprint.key, include_retired=True) if b.id == pinned_id)

    def retire_baseline(self, baseline_id: int, note: str = "retired by an operator") -> Baseline:
        """Retire one baseline; the key's next healthy run becomes its new baseline."""
        import sqlalchemy as sa

        table = tables().baselines
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
        results = tables().results
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            row = conn.execute(raw_select(self.columns()).where(results.c.id == result_id)).mappings().first()
        return None if row is None else decode_row(row)

    def recent(self, limit: int = 20, profile: str | None = None) -> list[ResultRecord]:
        """The newest attempts first; a row this deploykit cannot read is in its place, `unreadable`."""

        results = tables().results
        query = (
            raw_select(self.columns()).order_by(results.c.id.desc()).limit(max(0, min(limit, _ROW_ID_MAX)))
        )
        if profile is not None:
            query = query.where(results.c.profile_name == profile)
        with store_errors(self.url, "read"), self.engine.connect() as conn:
            return [decode_row(row) for row in conn.execute(query).mappings()]

    def count(self) -> int:
        import sqlalchemy as sa

        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(tables().results)).scalar_one())


def open_store(
    url: str | None = None, *, migrate: bool = True, warn: Callable[[str], None] | None = None
) -> SqlStore:
    """Open (creating when needed) the store at `url`, default `default_store_url()`, and write the rows
    spooled for it (`warn`: where each spool file set aside is said; default stderr)."""
    require_sqlalchemy()
    if url is not None:
        check_store_url(url)
    try:
        chosen = url or default_store_url()
    except errors.MissingPackageError as exc:  # no platformdirs: where the default store goes is unknown
        raise StoreError(f"{exc.message}, or {NO_STORE}", spoolable=False) from None
    check_store_url(chosen)
    store = SqlStore(create_store_engine(chosen), chosen)
    try:
        with store_errors(chosen, "open"):
            if store.read_only:
                store.check_readable()
            elif migrate:
                store.migrate()
        if migrate and not store.read_only:
            from deploykit.results.spool import replay

            store.replayed = replay(store, warn)
    except StoreError:
        store.close()
        raise
    return store


if TYPE_CHECKING:
    from deploykit.results.store import Store

    _IS_A_STORE: type[Store] = SqlStore  # mypy holds the SQL store to the protocol every command uses
