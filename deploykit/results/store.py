"""The seam every command writes and reads rows through: what a results store does, whatever keeps the rows.
The SQL store (deploykit.results.sql.store.SqlStore) is the one there is; another (a service, an object
store) implements this protocol and nothing that uses a store changes."""

from __future__ import annotations

from typing import Protocol

from deploykit.results.baseline import Baseline
from deploykit.results.record import ResultRecord


class Store(Protocol):
    """An opened results store. `url`: where it is, as given (secrets included: never print it);
    `replayed`: spooled rows this process wrote when it opened the store (deploykit.results.spool).

    Every method raises `deploykit.errors.StoreError` when the store cannot do it; `spoolable` says whether
    a row it refused may be kept to write later."""

    url: str
    replayed: int

    @property
    def display_url(self) -> str:
        """The URL with its passwords hidden: for messages, the terminal and stored rows."""
        ...

    @property
    def read_only(self) -> bool:
        """Rows can be read here, never written (a read-only copy): a row for it is spooled."""
        ...

    def close(self) -> None: ...

    def check_fits(self, **values: str | None) -> None:
        """Values a row will hold, checked against this store's limits before any work: a `UsageError`
        naming the field and the limit, not a row refused once the work is done."""
        ...

    def add(self, record: ResultRecord) -> int:
        """Write one row, once (a row whose `row_uuid` is stored already is not written again); its id.
        A passing row with a fingerprint settles its key's baseline in the same step."""
        ...

    def get(self, result_id: int) -> ResultRecord | None:
        """The row with this id; one this deploykit cannot read is an `unreadable` record, never an error."""
        ...

    def recent(self, limit: int = 20, profile: str | None = None) -> list[ResultRecord]:
        """The newest rows first, of one profile or all."""
        ...

    def count(self) -> int: ...

    def active_baseline(self, key: str) -> Baseline | None:
        """The baseline a fingerprint of `key` is compared with now, its fingerprint loaded."""
        ...

    def baselines(self, key: str | None = None, *, include_retired: bool = False) -> list[Baseline]:
        """Baselines, newest first: the active ones (and the retired ones when asked), of one key or all."""
        ...

    def disputed(self, key: str, since_row: int, limit: int = 50) -> list[ResultRecord]:
        """Rows of `key` after `since_row` whose fingerprint disagreed with an unconfirmed baseline."""
        ...

    def pin_baseline(self, result_id: int, note: str = "") -> Baseline:
        """Row `result_id`'s fingerprint as its key's active, confirmed baseline (an operator says)."""
        ...

    def retire_baseline(self, baseline_id: int, note: str = "retired by an operator") -> Baseline:
        """Retire one baseline; the key's next healthy run becomes its new baseline."""
        ...
