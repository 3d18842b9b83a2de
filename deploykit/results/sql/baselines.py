"""Baselines in the SQL store: a passing row's effect on its key's baseline, decided in the row's own
transaction under the key's lock (PostgreSQL: an advisory lock; SQLite: its one writer), and a fingerprint
that was `new` when taken judged again when another host's run made a baseline meanwhile."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from deploykit.results.baseline import Baseline
from deploykit.results.record import ResultRecord
from deploykit.results.sql.rows import timestamp
from deploykit.results.sql.schema import tables
from deploykit.smoke.fingerprint import Fingerprint

if TYPE_CHECKING:
    import sqlalchemy as sa


def baseline_from_row(row: Mapping[str, Any] | sa.RowMapping) -> Baseline:
    data = dict(row)
    for name in ("key_parts", "fingerprint"):
        if isinstance(data.get(name), str | bytes):
            data[name] = json.loads(data[name])
    for name in ("created_at", "confirmed_at", "retired_at"):
        if data.get(name) is not None:
            data[name] = timestamp(data[name])
    return Baseline.model_validate(data)


def lock_key(conn: sa.Connection, key: str) -> None:
    """Serialise baseline decisions of one key: PostgreSQL takes an advisory lock for the transaction;
    SQLite's writers are serialised already (BEGIN IMMEDIATE)."""
    import sqlalchemy as sa

    if conn.dialect.name == "postgresql":
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(int(key[:15] or "0", 16))))


def active_row(conn: sa.Connection, key: str) -> sa.RowMapping | None:
    import sqlalchemy as sa

    table = tables().baselines
    query = sa.select(table).where(table.c.key == key, table.c.status == "active").order_by(table.c.id.desc())
    return conn.execute(query).mappings().first()


def retire_active(conn: sa.Connection, key: str, note: str) -> None:
    import sqlalchemy as sa

    table = tables().baselines
    conn.execute(
        sa.update(table)
        .where(table.c.key == key, table.c.status == "active")
        .values(status="retired", retired_at=datetime.now(UTC), note=note)
    )


def insert_baseline(
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

    table = tables().baselines
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


def settle_baseline(conn: sa.Connection, record: ResultRecord, fingerprint: Fingerprint, row_id: int) -> None:
    """A passing row's effect on its key's baseline, in the row's own transaction (under the key's lock):
    the first healthy run of a key becomes its baseline (provisional); a match from another host confirms
    it; a third host siding with a disputed candidate replaces a provisional baseline with that candidate."""
    import sqlalchemy as sa

    comparison = fingerprint.comparison
    verdict = comparison.verdict if comparison is not None else "new"
    active = active_row(conn, fingerprint.key)
    if active is None:
        if verdict in ("new", "match"):
            insert_baseline(
                conn, fingerprint, row_id, record.hostname, note="the first healthy run of its key"
            )
        return
    table = tables().baselines
    if verdict == "match" and active["confirmed_by"] is None and active["hostname"] != record.hostname:
        conn.execute(
            sa.update(table)
            .where(table.c.id == active["id"])
            .values(confirmed_by=record.hostname, confirmed_at=datetime.now(UTC))
        )
    elif verdict == "decides" and comparison is not None and comparison.agrees_with_row is not None:
        results = tables().results
        host = conn.execute(sa.select(results.c.hostname).where(results.c.id == comparison.agrees_with_row))
        candidate_host = str(host.scalar() or "?")
        retire_active(
            conn,
            fingerprint.key,
            f"outvoted: rows #{comparison.agrees_with_row} ({candidate_host}) and #{row_id} "
            f"({record.hostname}) agree with each other, not with it",
        )
        insert_baseline(
            conn,
            fingerprint,
            comparison.agrees_with_row,
            candidate_host,
            confirmed_by=record.hostname,
            note=f"decided by row #{row_id} ({record.hostname})",
        )


def recheck_new(conn: sa.Connection, record: ResultRecord, fingerprint: Fingerprint) -> None:
    """A fingerprint compared while its key had no baseline (`new`), written after another host's run made
    one: compared again with that baseline, under the key's lock, before the row is written; the row's
    verdict follows (two replicas that compared at once are never both `new`)."""
    comparison = fingerprint.comparison
    if comparison is None or comparison.verdict != "new":
        return
    active = active_row(conn, fingerprint.key)
    if active is None:
        return
    import sqlalchemy as sa

    from deploykit.results.judge import CASE_NAME, judge_against

    results = tables().results
    cell = conn.execute(
        sa.select(sa.type_coerce(results.c.fingerprint, sa.Text)).where(results.c.id == active["result_id"])
    ).scalar()
    baseline = baseline_from_row({**active, "fingerprint": cell})
    fingerprint.comparison = again = judge_against(fingerprint, baseline, None, record.hostname)
    agrees = again.verdict in ("new", "match", "decides", "unchecked")
    for case in record.cases:
        if case.name == CASE_NAME:
            case.passed = case.passed and agrees
            case.diagnosis = "" if agrees else again.diagnosis
            case.text = again.diagnosis[:200] if agrees else case.text
    if not agrees and record.verdict == "pass":
        record.verdict, record.diagnosis = "fail", f"{CASE_NAME}: {again.diagnosis}"
