"""The `Store` protocol is the seam: a store that is not SQL (here, rows in a list) takes the rows every
command writes through `store_row`, and the spool replays into it, with no other change."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploykit.errors import StoreError
from deploykit.results.baseline import Baseline
from deploykit.results.record import ResultRecord
from deploykit.results.spool import keep, pending, replay
from deploykit.results.store import Store
from deploykit.results.store_row import store_row


class ListStore:
    """Rows in a list: the least a store can be."""

    def __init__(self, url: str, *, away: bool = False) -> None:
        self.url = url
        self.replayed = 0
        self.away = away
        self.rows: list[ResultRecord] = []

    @property
    def display_url(self) -> str:
        return self.url

    @property
    def read_only(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def check_fits(self, **values: str | None) -> None:
        pass

    def add(self, record: ResultRecord) -> int:
        if self.away:
            raise StoreError("the list is away")
        known = [r.id for r in self.rows if r.row_uuid == record.row_uuid and r.row_uuid is not None]
        if known and known[0] is not None:
            return known[0]
        self.rows.append(record.model_copy(update={"id": len(self.rows) + 1}))
        return len(self.rows)

    def get(self, result_id: int) -> ResultRecord | None:
        return next((r for r in self.rows if r.id == result_id), None)

    def recent(self, limit: int = 20, profile: str | None = None) -> list[ResultRecord]:
        return [r for r in reversed(self.rows) if profile in (None, r.profile_name)][:limit]

    def count(self) -> int:
        return len(self.rows)

    def active_baseline(self, key: str) -> Baseline | None:
        return None

    def baselines(self, key: str | None = None, *, include_retired: bool = False) -> list[Baseline]:
        return []

    def disputed(self, key: str, since_row: int, limit: int = 50) -> list[ResultRecord]:
        return []

    def pin_baseline(self, result_id: int, note: str = "") -> Baseline:
        raise StoreError("a list keeps no baselines")

    def retire_baseline(self, baseline_id: int, note: str = "retired by an operator") -> Baseline:
        raise StoreError("a list keeps no baselines")


def _row(name: str) -> ResultRecord:
    return ResultRecord(command="smoke", verdict="pass", stage="done", profile_name=name)


def test_a_store_that_is_not_sql_takes_the_rows_store_row_writes() -> None:
    store: Store = ListStore("list://here")
    warnings: list[str] = []
    row_id, where = store_row(_row("a"), store, warnings.append)
    assert (row_id, where, warnings) == (1, "list://here", [])
    assert [r.profile_name for r in store.recent()] == ["a"]


def test_a_row_such_a_store_refuses_is_spooled_and_replayed_into_it_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'list.db'}"  # the spool keys its folder by the store's URL
    away = ListStore(url, away=True)
    warnings: list[str] = []
    row = _row("kept")
    assert store_row(row, away, warnings.append)[0] is None
    assert len(warnings) == 1 and "spooled in" in warnings[0]
    keep(row, url)  # the same row kept twice is one file (its row_uuid) and one row
    back = ListStore(url)
    assert replay(back) == 1 and pending(url) == []
    assert [(r.profile_name, r.row_uuid) for r in back.rows] == [("kept", row.row_uuid)]


@pytest.mark.parametrize("method", ["pin_baseline", "retire_baseline"])
def test_a_store_may_refuse_what_it_does_not_keep_with_one_store_error(method: str) -> None:
    with pytest.raises(StoreError):
        getattr(ListStore("list://here"), method)(1)
