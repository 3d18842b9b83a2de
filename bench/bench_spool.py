"""What the spool costs (deploykit.results.spool): keeping a row while its store is away, and replaying the
kept rows when the next command reaches it, on SQLite and on the real PostgreSQL of tools/ci-services.sh (a
fresh schema, dropped afterwards). Also the cost of a write that finds the store away: PostgreSQL on a closed
port (connection refused) and the row spooled, as the canary does it.

    .venv/bin/python bench/bench_spool.py [--rows 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PG_URL = os.environ.get(
    "DEPLOYKIT_TEST_PG_URL", "postgresql+psycopg://deploykit:deploykit@127.0.0.1:5432/deploykit_test"
)


def _record(index: int) -> object:
    from deploykit.results.record import ResultRecord
    from deploykit.smoke import CaseResult

    case = CaseResult(
        name="completion", kind="completion", endpoint="/v1/completions", model="m", passed=True
    )
    return ResultRecord(
        command="canary", verdict="pass", stage="heartbeat", diagnosis=f"row {index}", cases=[case] * 3
    )


def measure(store_url: str, rows: int) -> dict[str, float]:
    from deploykit.results.spool import keep, pending
    from deploykit.results.sql.store import open_store

    open_store(store_url).close()
    records = [_record(i) for i in range(rows)]
    started = time.perf_counter()
    for record in records:
        keep(record, store_url)  # type: ignore[arg-type]
    keep_s = time.perf_counter() - started
    assert len(pending(store_url)) == rows
    started = time.perf_counter()
    store = open_store(store_url)
    replay_s = time.perf_counter() - started
    replayed = store.replayed
    count = store.count()
    store.close()
    assert replayed == rows == count and not pending(store_url)
    return {"keep_ms_per_row": 1000 * keep_s / rows, "replay_ms_per_row": 1000 * replay_s / rows}


def away_ms(reps: int) -> float:
    """store_row against a PostgreSQL on a closed port: the refused connection and the row spooled."""
    import socket

    from deploykit.results.store_row import store_row

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql://nobody@127.0.0.1:{port}/none"
    times = []
    for index in range(reps):
        started = time.perf_counter()
        store_row(_record(index), url, lambda _line: None)  # type: ignore[arg-type]
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()
    import sqlalchemy as sa

    with tempfile.TemporaryDirectory() as folder:
        os.environ["DEPLOYKIT_SPOOL_DIR"] = str(Path(folder) / "spool")
        results = {"SQLite": measure(f"sqlite:///{folder}/results.sqlite", args.rows)}
        admin = sa.create_engine(PG_URL)
        schema = f"bench_{uuid.uuid4().hex[:10]}"
        with admin.begin() as conn:
            conn.execute(sa.schema.CreateSchema(schema))
        try:
            results["PostgreSQL"] = measure(f"{PG_URL}?options=-csearch_path%3D{schema}", args.rows)
        finally:
            with admin.begin() as conn:
                conn.execute(sa.schema.DropSchema(schema, cascade=True))
            admin.dispose()
        away = away_ms(20)
    print(f"{args.rows} rows spooled, then replayed by the next open_store:")
    print("| store | keep (ms/row) | replay (ms/row) |")
    print("|---|---|---|")
    for name, figures in results.items():
        print(f"| {name} | {figures['keep_ms_per_row']:.2f} | {figures['replay_ms_per_row']:.2f} |")
    print(f"store_row with the store away (PostgreSQL, closed port), row spooled: {away:.1f} ms median of 20")


if __name__ == "__main__":
    main()
