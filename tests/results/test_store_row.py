"""`store_row`: a store that cannot be opened is one line and a None id, the row spooled for the next command
that reaches the store, and neither names its password."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from deploykit.results.record import ResultRecord
from deploykit.results.store_row import store_row


def _record() -> ResultRecord:
    return ResultRecord(
        created_at=datetime.now(UTC), command="smoke", verdict="pass", stage="done", diagnosis="ok"
    )


def test_unreachable_store_is_one_line_that_hides_the_password_and_the_row_is_spooled() -> None:
    from deploykit.results.spool import pending

    warnings: list[str] = []
    url = "postgresql://deploykit:S3cret-pw@127.0.0.1:1/results?connect_timeout=1"
    record = _record()
    row_id, where = store_row(record, url, warnings.append, what="the smoke row")
    assert row_id is None
    assert len(warnings) == 1 and warnings[0].startswith("the smoke row is not stored yet")
    assert "spooled in" in warnings[0] and "lost" not in warnings[0]
    assert "S3cret-pw" not in where and "S3cret-pw" not in " ".join(warnings)
    assert "127.0.0.1:1/results" in where
    (spooled,) = pending(url)
    assert spooled.name == f"{record.row_uuid}.row.json"
    assert spooled.stat().st_mode & 0o777 == 0o600 and spooled.parent.stat().st_mode & 0o777 == 0o700
    assert "S3cret-pw" not in spooled.read_text()


def test_a_reachable_sqlite_store_gets_the_row(tmp_path: Path) -> None:
    warnings: list[str] = []
    row_id, where = store_row(_record(), f"sqlite:///{tmp_path / 'r.db'}", warnings.append)
    assert row_id == 1 and not warnings and where.endswith("r.db")
