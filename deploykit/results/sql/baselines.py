"""Baselines in the SQL store: every fingerprint a row brings judged again by the store, and a passing
row's effect on its key's baseline decided from that judgement, in the row's own transaction under the
key's lock (PostgreSQL: an advisory lock; SQLite: its one writer).

What a row says it compared (a spooled row replayed later, a row another writer made) is evidence, never a
verdict: a confirmed or pinned baseline changes only by an operator's pin or retire, and `decides` replaces
a provisional one only when the store finds the disputed candidate itself (docs/fingerprints.md)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from deploykit.results.baseline import Baseline
from deploykit.results.record import ResultRecord
from deploykit.results.sql.rows import decode_row, raw_select, timestamp
from deploykit.results.sql.schema import tables
from deploykit.smoke.fingerprint import Comparison, Fingerprint

if TYPE_CHECKING:
    import sqlalchemy as sa

_HEX = re.compile(r"[0-9a-f]+")
_AGREES = ("new", "match", "decides")
"""The judgements a fingerprint passes with."""


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
        digits = key[:15]
        number = (
            int(digits, 16)
            if _HEX.fullmatch(digits)
            else int.from_bytes(hashlib.sha256(key.encode()).digest()[:7], "big")  # never a crash
        )
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(number)))


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


def active_baseline_in(conn: sa.Connection, key: str) -> Baseline | None:
    """The key's active baseline as this transaction sees it, its row's fingerprint loaded."""
    import sqlalchemy as sa

    active = active_row(conn, key)
    if active is None:
        return None
    results = tables().results
    cell = conn.execute(
        sa.select(sa.type_coerce(results.c.fingerprint, sa.Text)).where(results.c.id == active["result_id"])
    ).scalar()
    return baseline_from_row({**active, "fingerprint": cell})


def disputed_rows(
    conn: sa.Connection, key: str, since_row: int, limit: int, present: frozenset[str] | None
) -> list[ResultRecord]:
    """Rows of `key` after `since_row` whose fingerprint disagreed with an unconfirmed baseline: the
    candidates a third replica may side with (`present`: the results columns the store has)."""
    results = tables().results
    query = (
        raw_select(present)
        .where(results.c.fingerprint_key == key, results.c.id > since_row)
        .order_by(results.c.id.desc())
        .limit(limit)
    )
    rows = [decode_row(row) for row in conn.execute(query).mappings()]
    return [
        r
        for r in rows
        if r.fingerprint is not None
        and r.fingerprint.comparison is not None
        and r.fingerprint.comparison.verdict == "disputed"
    ]


class _InTransaction:
    """The disputed candidates `judge_against` asks for, read in the row's own transaction."""

    def __init__(self, conn: sa.Connection, present: frozenset[str] | None) -> None:
        self.conn, self.present = conn, present

    def disputed(self, key: str, since_row: int, limit: int = 50) -> list[ResultRecord]:
        return disputed_rows(self.conn, key, since_row, limit, self.present)


def rejudge(
    conn: sa.Connection, record: ResultRecord, fingerprint: Fingerprint, present: frozenset[str] | None
) -> Comparison | None:
    """The row's fingerprint judged by the store as it is now, under the key's lock: the comparison the row
    brought (taken earlier, replayed from the spool, or forged) is replaced by the store's. The row's
    verdict follows when the judgement fails it (a `pass` becomes `fail`, its fingerprint case says why);
    a failed row is never made to pass. None, and nothing judged, for a fingerprint that was never
    compared (`unchecked`: no store when it was taken): it claims nothing, and settles nothing."""
    from deploykit.results.judge import CASE_NAME, judge_against

    claimed = fingerprint.comparison
    if claimed is not None and claimed.verdict == "unchecked":
        return None
    baseline = active_baseline_in(conn, fingerprint.key)
    judged = judge_against(fingerprint, baseline, _InTransaction(conn, present), record.hostname)
    fingerprint.comparison = judged
    if claimed is not None and claimed.verdict == judged.verdict:
        return judged
    agrees = judged.verdict in _AGREES
    for case in record.cases:
        if case.name != CASE_NAME:
            continue
        if agrees:
            case.text = judged.diagnosis[:200] if case.passed else case.text
        else:
            case.passed, case.diagnosis = False, judged.diagnosis
    if not agrees and record.verdict == "pass" and record.command != "gate":
        # A gate's verdict is about its candidate against the baseline it chose (another release's key, or
        # a drift a person accepted): the store's own comparison stays on the fingerprint, and a gate's row
        # moves no baseline (`settle_baseline` is never called for it; only `gate --adopt` pins one).
        record.verdict, record.diagnosis = "fail", f"{CASE_NAME}: {judged.diagnosis}"
    return judged


def settle_baseline(
    conn: sa.Connection,
    record: ResultRecord,
    fingerprint: Fingerprint,
    judged: Comparison | None,
    row_id: int,
) -> None:
    """A passing row's effect on its key's baseline, in the row's own transaction (under the key's lock),
    from the store's own judgement (`rejudge`), never the row's: the first healthy run of a key becomes its
    baseline (provisional); a match from another host confirms a provisional one; a `decides` (a third host
    siding with a disputed candidate the store found) replaces a provisional one with that candidate. A
    confirmed or pinned baseline is never changed here: only an operator's pin or retire changes it."""
    import sqlalchemy as sa

    if judged is None:
        return
    active = active_row(conn, fingerprint.key)
    if active is None:
        if judged.verdict == "new":
            insert_baseline(
                conn, fingerprint, row_id, record.hostname, note="the first healthy run of its key"
            )
        return
    provisional = active["confirmed_by"] is None and not active["pinned"]
    if not provisional:
        return
    table = tables().baselines
    if judged.verdict == "match" and active["hostname"] != record.hostname:
        conn.execute(
            sa.update(table)
            .where(table.c.id == active["id"])
            .values(confirmed_by=record.hostname, confirmed_at=datetime.now(UTC))
        )
    elif judged.verdict == "decides" and judged.agrees_with_row is not None:
        results = tables().results
        host = conn.execute(sa.select(results.c.hostname).where(results.c.id == judged.agrees_with_row))
        candidate_host = str(host.scalar() or "?")
        retire_active(
            conn,
            fingerprint.key,
            f"outvoted: rows #{judged.agrees_with_row} ({candidate_host}) and #{row_id} "
            f"({record.hostname}) agree with each other, not with it",
        )
        insert_baseline(
            conn,
            fingerprint,
            judged.agrees_with_row,
            candidate_host,
            confirmed_by=record.hostname,
            note=f"decided by row #{row_id} ({record.hostname})",
        )
