"""The results store, each test on both back-ends: a SQLite file and the real PostgreSQL that
tools/ci-services.sh starts on 127.0.0.1 (a fresh schema per test)."""

from __future__ import annotations

import json
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from deploykit.cli import app
from deploykit.errors import StoreError
from deploykit.paths import default_store_url
from deploykit.results.record import ResultRecord
from deploykit.results.sql.engine import create_store_engine
from deploykit.results.sql.schema import MIGRATIONS_TABLE, SCHEMA_VERSION, results_table
from deploykit.results.sql.store import SqlStore, open_store
from deploykit.results.urls import display_url, normalise_url
from deploykit.smoke import CaseResult
from tests.cli_process import start_python
from tests.cli_runner import CliRunner
from tests.results.raw_rows import raw_row

REPO = Path(__file__).resolve().parents[3]


def full_record(profile: str = "demo-cpu", verdict: str = "pass") -> ResultRecord:
    case = CaseResult(
        name="completion",
        kind="completion",
        endpoint="/v1/completions",
        model="tiny",
        passed=verdict == "pass",
        diagnosis="" if verdict == "pass" else "every generated id is 0",
        http_status=200,
        latency_s=0.42,
        prompt_tokens=5,
        completion_tokens=16,
        tokens_per_s=38.1,
        first_ids=[5, 9, 300],
        finish_reason="length",
        text=" once",
    )
    return ResultRecord(
        profile_name=profile,
        profile_id="ab" * 32,
        verdict=verdict,  # type: ignore[arg-type]
        stage="done",
        diagnosis="all 1 cases passed (completion)" if verdict == "pass" else "completion: every id is 0",
        base_url="http://127.0.0.1:8000",
        facts={"gpus": [], "error": "no GPU", "vllm_version": "0.32.0+cpu"},
        plan={"argv": ["vllm", "serve", "/m"], "env": {"HF_TOKEN": "${HF_TOKEN}"}},
        versions={"deploykit": "0.1.0", "vllm": "0.32.0+cpu", "torch": None},
        timings={"startup_s": 31.5, "case_completion_s": 0.42, "overhead_s": 0.2},
        cases=[case],
        fixes_active={"device_penalties": "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"},
        log_path="/tmp/x.log",
        log_tail="INFO started\nINFO done ✓",
    )


def test_a_record_comes_back_exactly(store: SqlStore) -> None:
    record = full_record()
    result_id = store.add(record)
    stored = store.get(result_id)
    assert stored is not None
    assert stored.id == result_id
    assert stored.model_dump(exclude={"id"}) == record.model_dump(exclude={"id"})
    assert stored.created_at.tzinfo is not None
    assert store.get(result_id + 1000) is None


def test_recent_lists_newest_first_and_filters_by_profile(store: SqlStore) -> None:
    ids = [store.add(full_record(profile=name)) for name in ("a", "b", "a", "c")]
    assert [r.id for r in store.recent()] == list(reversed(ids))
    assert [r.id for r in store.recent(limit=2)] == [ids[3], ids[2]]
    assert [r.id for r in store.recent(profile="a")] == [ids[2], ids[0]]
    assert store.count() == 4


def test_schema_is_versioned_and_opening_again_migrates_nothing(store_url: str) -> None:
    first = open_store(store_url)
    assert first.schema_version() == SCHEMA_VERSION
    assert first.migrate() == []
    with first.engine.connect() as conn:
        rows = conn.execute(sa.select(MIGRATIONS_TABLE.c.version).order_by(MIGRATIONS_TABLE.c.version)).all()
    assert [r.version for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    first.close()


def test_an_old_store_is_migrated_and_keeps_its_rows(store_url: str) -> None:
    old = SqlStore(create_store_engine(store_url), store_url)
    assert old.migrate(up_to=1) == [1]
    assert old.schema_version() == 1
    # A row as deploykit wrote it at schema version 1 (no fixes_active column yet).
    v1_table = results_table(sa.MetaData(), schema_version=1)
    later = {"id", "fixes_active", "fingerprint", "row_uuid", "gate"}
    row = full_record(profile="from-v1").model_dump(mode="json", exclude=later)
    row["created_at"] = datetime.now(UTC)
    with old.engine.begin() as conn:
        kept = int(conn.execute(sa.insert(v1_table).values(**row).returning(v1_table.c.id)).scalar_one())
    with old.engine.connect() as conn:
        assert not sa.inspect(conn).get_indexes("results")
    old.close()

    upgraded = open_store(store_url)
    assert upgraded.schema_version() == SCHEMA_VERSION
    record = upgraded.get(kept)
    assert record is not None and record.profile_name == "from-v1"
    assert record.fixes_active is None and record.row_uuid is None  # stored before the server was asked
    new = upgraded.get(upgraded.add(full_record(profile="after")))
    assert new is not None and new.fixes_active == full_record().fixes_active
    with upgraded.engine.connect() as conn:
        names = {index["name"] for index in sa.inspect(conn).get_indexes("results")}
    assert {"ix_results_created_at", "ix_results_profile"} <= names
    upgraded.close()


def test_a_store_from_a_newer_deploykit_is_refused(store: SqlStore, store_url: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.insert(MIGRATIONS_TABLE).values(version=99, description="future", applied_at=datetime.now(UTC))
        )
    with pytest.raises(StoreError, match="schema version 99, newer than"):
        open_store(store_url)


_WRITER = textwrap.dedent(
    """
    import sys
    from deploykit.results.record import ResultRecord
    from deploykit.results.sql.store import open_store
    url, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = open_store(url)  # both writers race on a store that does not exist yet
    for i in range(count):
        store.add(ResultRecord(profile_name=tag, verdict="pass", stage="done", diagnosis=f"{tag}-{i}"))
    store.close()
    """
)


def test_two_processes_writing_at_once_lose_no_row(store_url: str) -> None:
    count = 150
    writers = [
        start_python(["-c", _WRITER, store_url, tag, str(count)], cwd=REPO)  # forked: tests/cli_process.py
        for tag in ("one", "two")
    ]
    assert [w.wait(timeout=240) for w in writers] == [0, 0]
    store = open_store(store_url)
    records = store.recent(limit=10 * count)
    store.close()
    assert len(records) == 2 * count
    assert len({r.id for r in records}) == 2 * count
    for tag in ("one", "two"):
        assert sorted(r.diagnosis for r in records if r.profile_name == tag) == sorted(
            f"{tag}-{i}" for i in range(count)
        )


def test_cli_lists_and_shows_results(store: SqlStore, store_url: str) -> None:
    passed = store.add(full_record(profile="demo-cpu"))
    failed = store.add(full_record(profile="nan-model", verdict="fail"))
    runner = CliRunner()
    listed = runner.invoke(app, ["results", "list", "--store", store_url, "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [(r["id"], r["verdict"]) for r in rows] == [(failed, "fail"), (passed, "pass")]
    table = runner.invoke(app, ["results", "list", "--store", store_url])
    assert table.exit_code == 0 and "nan-model" in table.output and "demo-cpu" in table.output
    shown = runner.invoke(app, ["results", "show", str(failed), "--store", store_url, "--format", "json"])
    assert json.loads(shown.output)["cases"][0]["first_ids"] == [5, 9, 300]
    human = runner.invoke(app, ["results", "show", str(passed), "--store", store_url])
    assert human.exit_code == 0 and "verdict PASS" in human.output and "vllm serve /m" in human.output
    missing = runner.invoke(app, ["results", "show", "999999", "--store", store_url])
    assert missing.exit_code == 1


def test_sqlite_store_runs_in_wal_mode(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'r.sqlite'}")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    store.close()


def test_default_store_is_sqlite_in_the_user_data_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DEPLOYKIT_STORE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_store_url() == f"sqlite:///{tmp_path / 'deploykit' / 'results.sqlite'}"
    store = open_store()
    store.add(full_record())
    store.close()
    assert (tmp_path / "deploykit" / "results.sqlite").exists()
    monkeypatch.setenv("DEPLOYKIT_STORE", "postgresql://u:pw@db/results")
    assert default_store_url() == "postgresql://u:pw@db/results"


def test_urls_are_normalised_and_passwords_hidden() -> None:
    assert normalise_url("postgresql://u:pw@h/db") == "postgresql+psycopg://u:pw@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("/tmp/r.sqlite") == "sqlite:////tmp/r.sqlite"
    assert "pw" not in display_url("postgresql://u:pw@h/db")
    with pytest.raises(StoreError, match="unsupported store URL"):
        create_store_engine("mysql://u@h/db")


def test_unreachable_postgres_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match="cannot open the results store"):
        open_store("postgresql://nobody:pw@127.0.0.1:9/none?connect_timeout=2")


def _insert_raw(store: SqlStore, **changes: object) -> int:
    """A row as another writer (a newer deploykit) might leave it: the columns as given, raw."""
    row = raw_row(**changes)
    with store.engine.begin() as conn:
        table = results_table(sa.MetaData())
        return int(conn.execute(sa.insert(table).values(**row).returning(table.c.id)).scalar_one())


def test_a_row_this_deploykit_cannot_read_is_reported_as_such_and_the_rest_still_show(
    store: SqlStore, store_url: str
) -> None:
    """A newer deploykit sharing the store writes a verdict, a command or a JSON shape this one does not
    know: that row is listed as unreadable (with why), every other row as it is; no traceback."""
    first = store.add(full_record("a"))
    odd = {
        _insert_raw(store, verdict="degraded"): "verdict 'degraded'",
        _insert_raw(store, command="bench"): "command 'bench'",
        _insert_raw(store, cases=[{"name": "x", "from_the_future": True}]): "cases",
    }
    last = store.add(full_record("b", verdict="fail"))
    rows = {r.id: r for r in store.recent(limit=10)}
    assert rows[first].verdict == "pass" and rows[last].verdict == "fail"
    for row_id, why in odd.items():
        assert rows[row_id].unreadable and why in rows[row_id].diagnosis, rows[row_id]
        assert rows[row_id].created_at == datetime(2030, 1, 1, tzinfo=UTC)
        assert store.get(row_id) == rows[row_id]

    runner = CliRunner()
    listed = runner.invoke(app, ["results", "list", "--store", store_url, "-f", "json"])
    assert listed.exit_code == 0, listed.output
    verdicts = {row["id"]: row["verdict"] for row in json.loads(listed.stdout)}
    assert verdicts == {first: "pass", last: "fail", **dict.fromkeys(odd, "unreadable")}
    for row_id in odd:
        shown = runner.invoke(app, ["results", "show", str(row_id), "--store", store_url])
        assert shown.exit_code == 0 and "UNREADABLE" in shown.stdout, shown.output


def test_a_cell_that_is_not_json_or_a_time_is_one_unreadable_row(tmp_path: Path) -> None:
    """SQLite keeps JSON and times as text: a cell that does not decode fails that row, not the query."""
    store = open_store(str(tmp_path / "r.sqlite"))
    good = store.add(full_record())
    with store.engine.begin() as conn:
        for created, versions in (("2030-01-01 00:00:00", "{not json"), ("garbage", "{}")):
            conn.exec_driver_sql(
                "INSERT INTO results (created_at, command, hostname, verdict, stage, diagnosis, versions, "
                f"timings, cases, log_tail) VALUES ('{created}', 'serve', 'h', 'pass', 'done', '', "
                f"'{versions}', '{{}}', '[]', '')"
            )
    rows = store.recent()
    store.close()
    assert [r.verdict for r in rows] == ["unreadable", "unreadable", "pass"] and rows[2].id == good
    assert "versions is not JSON" in rows[1].diagnosis and "'garbage' is not a time" in rows[0].diagnosis


def test_an_id_or_limit_past_what_sql_stores_is_no_row_not_an_overflow(store: SqlStore) -> None:
    store.add(full_record())
    assert store.get(10**20) is None and store.get(0) is None
    assert len(store.recent(limit=10**20)) == 1


def test_an_unreadable_row_is_never_written_back(store: SqlStore) -> None:
    with pytest.raises(StoreError, match="never written back"):
        store.add(ResultRecord(verdict="unreadable", stage="unreadable"))


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file::memory:?cache=shared"])
def test_an_in_memory_store_is_refused_rows_would_vanish(url: str) -> None:
    with pytest.raises(StoreError, match="in-memory SQLite database: its rows vanish"):
        open_store(url)


def test_an_empty_store_url_is_refused_not_taken_for_the_default() -> None:
    with pytest.raises(StoreError, match="--store '' names no store"):
        open_store("")


def test_a_stored_base_url_never_keeps_its_password(store: SqlStore) -> None:
    record = full_record().model_copy(update={"base_url": "http://user:S3cret@h:8000/?api_key=S3cret"})
    row_id = store.add(ResultRecord.model_validate(record.model_dump()))
    stored = store.get(row_id)
    assert stored is not None and stored.base_url == "http://user:***@h:8000/?api_key=***"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1:1/db?password=S3cret",
        "postgresql://u:S3cret@127.0.0.1:notaport/db",
        "postgresql://u:S3c@:/%ret@127.0.0.1:1/db",
        "postgresql://u:S3c/ret?x@127.0.0.1:1/db",
        "mysql://u:S3cret@h/db",
    ],
)
def test_a_store_url_password_is_never_in_an_error(url: str) -> None:
    with pytest.raises(StoreError) as raised:
        open_store(url)
    assert "S3c" not in str(raised.value) and "ret@" not in str(raised.value), raised.value
    assert "S3c" not in display_url(url)
