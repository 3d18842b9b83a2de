"""The store's small promises (issue 32), each on a real store: inputs of any length kept (or refused before
any work with one line naming the field and the limit), a row validated before it is inserted, a read-only
store read, a full disk named as one, passwords older versions stored scrubbed by the migration, and the
baseline race (two replicas that compared before either wrote are never both `new`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from deploykit import errors
from deploykit.errors import StoreError
from deploykit.results.record import ResultRecord
from deploykit.results.sql.engine import create_store_engine
from deploykit.results.sql.rows import check_fits
from deploykit.results.sql.schema import column_limits, results_table
from deploykit.results.sql.store import SqlStore, open_store
from deploykit.results.store_row import store_row
from deploykit.smoke import CaseResult
from deploykit.smoke.fingerprint import Comparison
from tests.results.raw_rows import raw_row
from tests.results.sql.test_store_baselines import KEY, fingerprint
from tests.vllm_harness import REPO

# --- inputs the store must hold -------------------------------------------------------------------------


def test_a_long_profile_name_and_url_are_kept_whole_on_every_backend(store: SqlStore) -> None:
    """Formerly VARCHAR(200)/(500) on PostgreSQL: PASS printed, the row refused after the work."""
    url = "http://127.0.0.1:8000/" + "p" * 600
    row_id = store.add(ResultRecord(verdict="pass", stage="done", profile_name="n" * 250, base_url=url))
    back = store.get(row_id)
    assert back is not None and back.profile_name == "n" * 250 and back.base_url == url


def test_a_value_past_a_column_limit_is_one_line_naming_field_and_limit_before_any_work() -> None:
    assert column_limits()["hostname"] == 255 and "profile_name" not in column_limits()
    with pytest.raises(errors.UsageError, match=r"^hostname is 300 characters; .* at most 255"):
        check_fits(hostname="h" * 300)
    check_fits(profile_name="n" * 10_000, base_url="u" * 10_000)  # no limit on what a person chooses


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic on the list where a str belongs: the point
def test_a_row_that_would_not_read_back_is_refused_naming_the_field(store: SqlStore) -> None:
    """An answer's content as a list reached `text` unvalidated: the row was written and read `unreadable`."""
    fields = CaseResult(
        name="c", kind="chat", endpoint="/v1/chat/completions", model="m", passed=True
    ).__dict__
    case = CaseResult.model_construct(**{**fields, "text": ["a", "list"]})
    record = ResultRecord(verdict="pass", stage="done")
    record.cases = [case]
    with pytest.raises(StoreError, match=r"would not read back \(cases\.0\.text"):
        store.add(record)
    assert store.recent() == []
    said: list[str] = []
    assert store_row(record, store, said.append) == (None, store.display_url)
    assert len(said) == 1 and "would not read back" in said[0] and "spooled" not in said[0]


# --- read-only stores, a full disk --------------------------------------------------------------------------


def _store_with_rows(path: Path, count: int) -> None:
    store = open_store(f"sqlite:///{path}")
    for index in range(count):
        store.add(ResultRecord(verdict="pass", stage="done", diagnosis=f"row {index}"))
    store.close()


def test_a_store_opened_read_only_is_read_without_its_wal_files_and_never_written(tmp_path: Path) -> None:
    path = tmp_path / "copy.sqlite"
    _store_with_rows(path, 3)
    before = sorted(p.name for p in tmp_path.iterdir())
    store = open_store(f"sqlite:///{path}?mode=ro")
    try:
        assert store.read_only and [r.diagnosis for r in store.recent()] == ["row 2", "row 1", "row 0"]
        with pytest.raises(StoreError, match="read-only"):
            store.add(ResultRecord(verdict="pass", stage="done"))
    finally:
        store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no -shm, no -wal made


def _user_namespaces() -> bool:
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


def test_results_list_reads_a_store_on_read_only_media(tmp_path: Path) -> None:
    """The store's directory bind-mounted read-only (in a user and mount namespace): WAL's -shm cannot be
    made there, and `results list` still reads every row."""
    if not _user_namespaces():
        pytest.skip("no user namespaces here to mount a read-only directory in")
    media = tmp_path / "media"
    media.mkdir()
    _store_with_rows(media / "results.sqlite", 2)
    read_only = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    listed = subprocess.run(
        [
            *("unshare", "-rm", "sh", "-c", read_only, "sh", str(media), sys.executable, "-m", "deploykit"),
            *("results", "list", "--store", str(media / "results.sqlite"), "-f", "json"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "row 1" in listed.stdout and "row 0" in listed.stdout


_FILLS_THE_DISK = textwrap.dedent(
    """
    import sys
    from deploykit.errors import StoreError
    from deploykit.results.record import ResultRecord
    from deploykit.results.sql.store import open_store
    store = open_store(sys.argv[1])
    try:
        for index in range(10_000):
            store.add(ResultRecord(verdict="pass", stage="done", log_tail="x" * 20_000))
    except StoreError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
    """
)


def test_a_store_on_a_full_disk_says_the_disk_is_full(tmp_path: Path) -> None:
    """A real full disk: a 256 KiB tmpfs mounted in a user and mount namespace of the writing process."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    mounted = 'mount -t tmpfs -o size=256k tmpfs "$1" && exec "$2" -c "$3" "$4"'
    command = ["unshare", "-rm", "sh", "-c", mounted, "sh", str(disk), sys.executable, _FILLS_THE_DISK]
    if not _user_namespaces():
        pytest.skip("no user namespaces here to mount a small disk in")
    ran = subprocess.run(
        [*command, f"sqlite:///{disk / 'results.sqlite'}"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert ran.returncode == 1, ran.stderr[-2000:]
    (said,) = ran.stderr.strip().splitlines()
    assert f"the disk holding {disk} is full" in said and "disk I/O error" not in said, said


# --- the migration scrubs old passwords -----------------------------------------------------------------


def test_passwords_older_versions_wrote_into_base_url_are_scrubbed_from_the_database(store_url: str) -> None:
    old = SqlStore(create_store_engine(store_url), store_url)
    old.migrate(up_to=4)  # the schema of the previous release, without the additions
    v4 = results_table(sa.MetaData(), schema_version=4)
    raw = raw_row(created_at=sa.func.now(), command="smoke", hostname="h")
    leaked = ["http://admin:S3cretPw@10.0.0.1:8000", "http://10.0.0.1:8000/?password=S3cretPw&x=1"]
    with old.engine.begin() as conn:
        for url in [*leaked, "http://clean:8000"]:
            conn.execute(sa.insert(v4).values(**raw, base_url=url))
    old.close()

    open_store(store_url).close()
    check = create_store_engine(store_url)
    with check.connect() as conn:
        stored = [str(v) for v in conn.execute(sa.text("SELECT base_url FROM results ORDER BY id")).scalars()]
    check.dispose()
    assert not any("S3cretPw" in url for url in stored), stored
    assert stored[2] == "http://clean:8000" and "10.0.0.1:8000" in stored[0]


# --- the baseline race ----------------------------------------------------------------------------------


def _new_run(host: str, first_id: int) -> ResultRecord:
    """A run that compared while the key had no baseline (`new`), about to be written."""
    mine = fingerprint(first_id)
    mine.comparison = Comparison(verdict="new", diagnosis="no baseline for this key yet")
    case = CaseResult(
        name="fingerprint", kind="fingerprint", endpoint="/v1/completions", model="m", passed=True
    )
    return ResultRecord(hostname=host, verdict="pass", stage="done", fingerprint=mine, cases=[case])


def test_two_replicas_that_compared_before_either_wrote_are_not_both_new(store: SqlStore) -> None:
    first = store.add(_new_run("host-a", 5))
    agreeing = _new_run("host-b", 5)
    second = store.add(agreeing)
    stored = store.get(second)
    assert stored is not None and stored.fingerprint is not None and stored.fingerprint.comparison is not None
    assert stored.fingerprint.comparison.verdict == "match" and stored.verdict == "pass"
    baseline = store.active_baseline(KEY)
    assert baseline is not None and (baseline.result_id, baseline.confirmed_by) == (first, "host-b")

    differing = _new_run("host-c", 9)
    third = store.get(store.add(differing))
    assert third is not None and third.verdict == "fail" and differing.verdict == "fail"  # the caller sees it
    assert third.fingerprint is not None and third.fingerprint.comparison is not None
    assert third.fingerprint.comparison.verdict == "mismatch"  # host-b confirmed the baseline
    assert not third.cases[0].passed and "differs" in third.cases[0].diagnosis


def test_a_pin_names_its_own_row(store: SqlStore) -> None:
    rows = [store.add(_new_run(f"host-{n}", 5)) for n in range(3)]
    for row in rows:
        assert store.pin_baseline(row).result_id == row
