"""N−1: the previous release (the commit this schema's additions start from) reads and writes a store the
new code migrated, on SQLite and PostgreSQL, with its own code: `git archive` of that commit, run with
PYTHONPATH pointing at the copy. The additions (row_uuid, TEXT inputs, scrubbed passwords) are recorded in
`schema_additions`, so the compatibility line it checks (`schema_migrations`) stays at a version it knows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
import sqlalchemy as sa

from deploykit.results.record import ResultRecord
from deploykit.results.sql.schema import ADDITIONS, SCHEMA_VERSION
from deploykit.results.sql.store import open_store
from tests.http_server import Answers500, serving
from tests.vllm_harness import REPO

PREVIOUS_RELEASE = "a4ccb8c"
"""The commit before the schema additions: it knows migrations 1–4 and refuses a store past them."""


@pytest.fixture(scope="module")
def previous_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's deploykit package, from git."""
    known = subprocess.run(
        ["git", "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"], capture_output=True
    )
    if known.returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE} is not in this checkout's history (a shallow clone?)")
    folder = tmp_path_factory.mktemp("previous-release")
    archive = folder / "deploykit.tar"
    subprocess.run(
        ["git", "-C", str(REPO), "archive", "-o", str(archive), PREVIOUS_RELEASE, "deploykit"], check=True
    )
    with tarfile.open(archive) as tar:
        tar.extractall(folder, filter="data")
    return folder


def run_previous(release: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(release)}
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=env, cwd=release, timeout=300
    )


_OLD_READER_WRITER = textwrap.dedent(
    """
    import json, sys
    import deploykit
    from deploykit.store import SCHEMA_VERSION, ResultRecord, open_store
    assert deploykit.__file__.startswith(sys.argv[2]), deploykit.__file__
    store = open_store(sys.argv[1])
    written = store.add(ResultRecord(command="smoke", verdict="pass", stage="done", profile_name="old"))
    rows = store.recent(limit=50)
    print(json.dumps({"schema": SCHEMA_VERSION, "written": written,
                      "rows": [[r.id, r.verdict, r.profile_name] for r in rows]}))
    store.close()
    """
)


def test_the_previous_release_reads_writes_and_smokes_against_a_store_the_new_code_migrated(
    previous_release: Path, store_url: str
) -> None:
    store = open_store(store_url)
    new_id = store.add(ResultRecord(command="serve", verdict="pass", stage="done", profile_name="n" * 300))
    assert store.schema_version() == SCHEMA_VERSION
    assert store.additions() == [a.number for a in ADDITIONS]
    store.close()

    old = run_previous(previous_release, "-c", _OLD_READER_WRITER, store_url, str(previous_release))
    assert old.returncode == 0, old.stderr[-3000:]
    seen = json.loads(old.stdout)
    assert seen["schema"] == SCHEMA_VERSION  # the line it checks did not move
    rows = {row[0]: row for row in seen["rows"]}
    assert rows[new_id][1:] == ["pass", "n" * 300]  # the new code's row, read by the old code

    with serving(Answers500) as server:
        smoked = run_previous(previous_release, "-m", "deploykit", "smoke", "--url", server, "--model", "m",
                              "--store", store_url)  # fmt: skip
    assert "newer than this deploykit knows" not in smoked.stderr, smoked.stderr
    assert smoked.returncode == 1 and "verdict: FAIL" in smoked.stdout, smoked.stdout + smoked.stderr
    assert "stored in" in smoked.stdout, smoked.stdout

    store = open_store(store_url)
    try:
        mine = store.recent(limit=10)
    finally:
        store.close()
    assert not any(r.unreadable for r in mine)
    by_id = {r.id: r for r in mine}
    assert by_id[seen["written"]].row_uuid is None  # the old code does not know the column: NULL
    assert by_id[new_id].row_uuid is not None
    assert [r.command for r in mine][:2] == ["smoke", "smoke"]


def test_a_breaking_version_still_locks_the_previous_release_out(
    previous_release: Path, store_url: str
) -> None:
    """What a breaking change does (a number on the compatibility line): the old code refuses, by design."""
    store = open_store(store_url)
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("INSERT INTO schema_migrations (version, description, applied_at) VALUES (:v, 'x', :t)"),
            {"v": SCHEMA_VERSION + 1, "t": "2030-01-01 00:00:00+00:00"},
        )
    store.close()
    old = run_previous(previous_release, "-c", _OLD_READER_WRITER, store_url, str(previous_release))
    assert old.returncode != 0 and "newer than this deploykit knows" in old.stderr
