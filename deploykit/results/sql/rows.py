"""A record as the row it is stored as, and a stored row as a record: checked before it is written (it reads
back, it fits every back-end's columns), read column by column as text so that one cell a newer deploykit
filled differently makes that row `unreadable`, saying why, never the whole query an error."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from deploykit import errors
from deploykit.errors import StoreError
from deploykit.results.record import UNREADABLE, ResultRecord
from deploykit.results.sql.schema import column_limits, tables

if TYPE_CHECKING:
    import sqlalchemy as sa

    from deploykit.results.store import Store


NUL_SHOWN = "\u2400"
"""What a NUL (0x00) in a row's text column is stored as: U+2400 SYMBOL FOR NULL."""


def keep_nul_as_symbol(record: ResultRecord) -> None:
    """PostgreSQL's text columns cannot hold NUL (a server's error text may carry one): such a row was
    refused whenever it was sent. Each top-level text field of `record` keeps it as `NUL_SHOWN` instead, on
    every back-end (a row SQLite keeps is the row PostgreSQL keeps); the record is changed in place, so the
    baselines it settles name the same host. JSON columns keep the character itself (JSON escapes it)."""
    for name, value in record:
        if isinstance(value, str) and "\x00" in value:
            setattr(record, name, value.replace("\x00", NUL_SHOWN))


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


def raw_select(present: frozenset[str] | None = None) -> sa.Select[Any]:
    """Every column (of those `present` in the store), with JSON and time columns as the database's text:
    decoding them is `decode_row`'s job, row by row, so one cell a newer writer filled differently cannot
    fail the whole query."""
    import sqlalchemy as sa

    results = tables().results
    return sa.select(
        *(
            sa.type_coerce(column, sa.Text).label(column.name)
            if isinstance(column.type, sa.JSON | sa.DateTime)
            else column
            for column in results.columns
            if present is None or column.name in present
        )
    )


def decode_row(row: sa.RowMapping) -> ResultRecord:
    """One stored row as a record; a row that does not decode or validate (a verdict, command or JSON
    a newer deploykit wrote) is an `unreadable` record saying why, so the rows around it still show."""
    import sqlalchemy as sa

    data = dict(row)
    data.pop("fingerprint_key", None)
    data.setdefault("row_uuid", None)  # a store opened read-only before addition 1
    try:
        data["created_at"] = timestamp(data["created_at"])
        for column in tables().results.columns:
            if isinstance(column.type, sa.JSON) and isinstance(data.get(column.name), str | bytes):
                try:
                    data[column.name] = json.loads(data[column.name])
                except ValueError as exc:
                    raise ValueError(f"{column.name} is not JSON ({exc})") from None
        return ResultRecord.model_validate(data)
    except (ValueError, TypeError, ValidationError) as exc:
        return _unreadable(data, exc)


def timestamp(value: Any) -> datetime:
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
        created = timestamp(data.get("created_at"))
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
