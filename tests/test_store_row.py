"""`store_row`: a store that cannot be opened is a warning and a None id, and neither names its password."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from deploykit.store import ResultRecord
from deploykit.store_row import store_row


def _record() -> ResultRecord:
    return ResultRecord(
        created_at=datetime.now(UTC), command="smoke", verdict="pass", stage="done", diagnosis="ok"
    )


def test_unreachable_store_is_a_warning_that_hides_the_password() -> None:
    warnings: list[str] = []
    url = "postgresql://deploykit:S3cret-pw@127.0.0.1:1/results?connect_timeout=1"
    row_id, where = store_row(_record(), url, warnings.append, what="the smoke row")
    assert row_id is None
    assert warnings and warnings[0].startswith("the smoke row could not be stored")
    assert "S3cret-pw" not in where and "S3cret-pw" not in " ".join(warnings)
    assert "127.0.0.1:1/results" in where


def test_a_reachable_sqlite_store_gets_the_row(tmp_path: Path) -> None:
    warnings: list[str] = []
    row_id, where = store_row(_record(), f"sqlite:///{tmp_path / 'r.db'}", warnings.append)
    assert row_id == 1 and not warnings and where.endswith("r.db")
