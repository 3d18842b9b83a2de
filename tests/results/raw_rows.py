"""A results row as another writer might leave it (a newer or older deploykit): the columns every row
needs, raw, for the tests that insert around the store's own writer (tests/results/sql/)."""

from __future__ import annotations

from datetime import UTC, datetime


def raw_row(**changes: object) -> dict[str, object]:
    """The required columns of a `results` row with plain values; `changes` set or add columns."""
    return {
        "created_at": datetime(2030, 1, 1, tzinfo=UTC),
        "command": "serve",
        "hostname": "elsewhere",
        "verdict": "pass",
        "stage": "done",
        "diagnosis": "",
        "versions": {},
        "timings": {},
        "cases": [],
        "log_tail": "",
        **changes,
    }
