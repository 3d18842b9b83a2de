"""`store_row`: a store that cannot be opened is one line and a None id, the row spooled for the next command
that reaches the store, and neither names its password."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from deploykit.fleet_baseline import key_digest
from deploykit.results.record import ResultRecord
from deploykit.results.sql.store import open_store
from deploykit.results.store_row import store_row
from deploykit.smoke import CaseResult
from deploykit.smoke.fingerprint import Comparison, Fingerprint, ProbeAnswer
from tests.serve_helpers import BACKENDS, fresh_store_url


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


NUL = "\x00"


def _with_nul_everywhere() -> ResultRecord:
    """A passing row with a fingerprint and a NUL in every text field (a server's error text, a hostname)."""
    parts = {"model": "m", "probe_set": 1}
    answers = [ProbeAnswer(prompt="p", ids=[5], top=[{5: -0.5, 1: -3.0}])]
    mine = Fingerprint(dtype="float32", key=key_digest(parts), key_parts=parts, answers=answers)
    mine.comparison = Comparison(verdict="new", diagnosis=f"no{NUL}baseline")
    case = CaseResult(
        name="c", kind="completion", endpoint="/v1/completions", model=f"m{NUL}", passed=True,
        diagnosis=f"case{NUL}text",
    )  # fmt: skip
    return ResultRecord(
        command="smoke",
        verdict="pass",
        stage=f"do{NUL}ne",
        diagnosis=f"the server said {NUL} mid-text",
        hostname=f"host{NUL}a",
        profile_name=f"p{NUL}",
        profile_id=f"id{NUL}",
        base_url=f"http://127.0.0.1:8000/{NUL}",
        log_path=f"/var/log/{NUL}x",
        log_tail=f"line{NUL}\nline",
        versions={"deploykit": f"1{NUL}"},
        cases=[case],
        fingerprint=mine,
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_row_with_a_nul_in_any_text_field_is_stored_on_every_back_end(backend: str, tmp_path: Path) -> None:
    """PostgreSQL's text columns cannot hold NUL: such a row was refused (and as a spooled row, blocked the
    spool for good). Top-level text columns keep it as U+2400 (SYMBOL FOR NULL), on both back-ends alike;
    JSON columns keep the character itself (JSON escapes it)."""
    with fresh_store_url(backend, tmp_path) as url:
        warnings: list[str] = []
        record = _with_nul_everywhere()
        row_id, _ = store_row(record, url, warnings.append)
        assert row_id is not None and warnings == [], warnings
        store = open_store(url)
        try:
            stored = store.get(row_id)
            baseline = store.active_baseline(record.fingerprint.key)  # type: ignore[union-attr]
        finally:
            store.close()
    assert stored is not None
    shown = "\u2400"
    assert (stored.stage, stored.diagnosis, stored.hostname) == (
        f"do{shown}ne", f"the server said {shown} mid-text", f"host{shown}a",
    )  # fmt: skip
    assert (stored.profile_name, stored.profile_id, stored.log_path) == (
        f"p{shown}",
        f"id{shown}",
        "/var/log/␀x",
    )
    assert stored.base_url == f"http://127.0.0.1:8000/{shown}" and stored.log_tail == f"line{shown}\nline"
    assert stored.cases[0].diagnosis == f"case{NUL}text" and stored.versions == {"deploykit": f"1{NUL}"}
    assert baseline is not None and baseline.hostname == f"host{shown}a"
