"""Fingerprints in the results store and the baselines of their keys, on both back-ends (a SQLite file and the
real PostgreSQL tools/ci-services.sh starts): the migration, the first healthy run becoming the baseline,
confirmation by another host, the disputed start the third replica decides, pin and retire, and the keys."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import sqlalchemy as sa

from deploykit.cli import app
from deploykit.fleet_baseline import FingerprintCheck, judge_against, key_digest
from deploykit.results.record import ResultRecord
from deploykit.results.spool import keep
from deploykit.results.sql.engine import create_store_engine
from deploykit.results.sql.schema import results_table
from deploykit.results.sql.store import SqlStore, open_store
from deploykit.smoke import CaseResult
from deploykit.smoke.fingerprint import Comparison, Fingerprint, ProbeAnswer, logprob_tolerance
from tests.cli_runner import CliRunner

PARTS = {
    "model": "builtin:tiny-llama",
    "weights": "sha256:ab",
    "dtype": "float32",
    "vllm": "0.32.0",
    "device": "cpu: test",
    "tensor_parallel_size": 1,
    "fixes": [],
    "probe_set": 1,
    "top_k": 5,
}
KEY = key_digest(PARTS)
TOLERANCE = logprob_tolerance("float32")


def fingerprint(first_id: int) -> Fingerprint:
    answers = [
        ProbeAnswer(prompt="p", ids=[first_id, 7], top=[{first_id: -0.5, 1: -0.6}, {7: -0.1, 2: -3.0}])
    ]
    return Fingerprint(dtype="float32", key=KEY, key_parts=PARTS, answers=answers, tolerance=TOLERANCE)


def run_on(store: SqlStore, host: str, first_id: int) -> tuple[int, Fingerprint]:
    """What a start-up smoke does: judge against the active baseline, then store the row (pass or fail)."""
    mine = fingerprint(first_id)
    mine.comparison = judge_against(mine, store.active_baseline(KEY), store, host)
    passed = mine.comparison.verdict in ("new", "match", "decides")
    record = ResultRecord(
        hostname=host,
        verdict="pass" if passed else "fail",
        stage="done",
        diagnosis=mine.comparison.diagnosis,
        fingerprint=mine,
    )
    return store.add(record), mine


def test_the_first_healthy_run_becomes_a_provisional_baseline_and_another_host_confirms_it(
    store: SqlStore,
) -> None:
    row_a, first = run_on(store, "host-a", 5)
    assert first.comparison is not None and first.comparison.verdict == "new"
    baseline = store.active_baseline(KEY)
    assert baseline is not None and (baseline.result_id, baseline.hostname, baseline.confirmed_by) == (
        row_a,
        "host-a",
        None,
    )
    assert baseline.fingerprint == store.get(row_a).fingerprint  # type: ignore[union-attr]
    # The same host agreeing with itself confirms nothing; another host does.
    run_on(store, "host-a", 5)
    assert store.active_baseline(KEY).confirmed_by is None  # type: ignore[union-attr]
    _, second = run_on(store, "host-b", 5)
    assert second.comparison is not None and second.comparison.verdict == "match"
    assert second.comparison.baseline_row == row_a and second.comparison.baseline_host == "host-a"
    assert store.active_baseline(KEY).confirmed_by == "host-b"  # type: ignore[union-attr]
    # Now a faulty replica is a mismatch, named against the confirmed baseline.
    _, faulty = run_on(store, "host-c", 9)
    assert faulty.comparison is not None and faulty.comparison.verdict == "mismatch"
    assert f"row #{row_a} from host host-a" in faulty.comparison.diagnosis
    assert "expected id 5, got id 9" in faulty.comparison.diagnosis
    assert store.active_baseline(KEY).result_id == row_a  # type: ignore[union-attr]


def test_two_replicas_that_disagree_from_the_start_pick_neither_and_the_third_decides(
    store: SqlStore,
) -> None:
    row_a, _ = run_on(store, "host-a", 9)  # the faulty one happened to start first
    row_b, second = run_on(store, "host-b", 5)
    assert second.comparison is not None and second.comparison.verdict == "disputed"
    assert "picks neither" in second.comparison.diagnosis and "baseline pin" in second.comparison.diagnosis
    assert store.active_baseline(KEY).result_id == row_a  # type: ignore[union-attr]  # nothing silently picked
    row_c, third = run_on(store, "host-c", 5)
    assert third.comparison is not None and third.comparison.verdict == "decides"
    assert third.comparison.agrees_with_row == row_b
    now = store.active_baseline(KEY)
    assert now is not None and (now.result_id, now.hostname, now.confirmed_by) == (row_b, "host-b", "host-c")
    retired = [b for b in store.baselines(KEY, include_retired=True) if b.status == "retired"]
    assert [b.result_id for b in retired] == [row_a] and "outvoted" in retired[0].note
    # host-a's canary now compares with the new baseline and finds itself wrong.
    assert judge_against(fingerprint(9), now, store, "host-a").verdict == "mismatch"
    assert row_c > row_b


def test_the_same_host_disagreeing_with_its_own_baseline_is_a_mismatch(store: SqlStore) -> None:
    run_on(store, "host-a", 5)
    _, later = run_on(store, "host-a", 9)
    assert later.comparison is not None and later.comparison.verdict == "mismatch"


def test_a_failing_row_never_becomes_a_baseline(store: SqlStore) -> None:
    record = ResultRecord(verdict="fail", stage="done", fingerprint=fingerprint(5))
    store.add(record)
    assert store.active_baseline(KEY) is None


def test_pin_and_retire(store: SqlStore, store_url: str) -> None:
    row_a, _ = run_on(store, "host-a", 9)
    row_b, _ = run_on(store, "host-b", 5)  # disputed
    runner = CliRunner()
    pinned = runner.invoke(app, ["results", "baseline", "pin", str(row_b), "--store", store_url])
    assert pinned.exit_code == 0, pinned.output
    active = store.active_baseline(KEY)
    assert active is not None and active.result_id == row_b and active.pinned
    assert active.confirmed_by == "operator"
    shown = runner.invoke(app, ["results", "baseline", "show", "--store", store_url, "--format", "json"])
    assert shown.exit_code == 0, shown.output
    assert [b["result_id"] for b in json.loads(shown.output)] == [row_b]
    everything = runner.invoke(
        app, ["results", "baseline", "show", "--all", "--store", store_url, "--format", "json"]
    )
    assert sorted(b["result_id"] for b in json.loads(everything.output)) == sorted([row_a, row_b])
    assert judge_against(fingerprint(9), active, store, "host-a").verdict == "mismatch"
    retired = runner.invoke(app, ["results", "baseline", "retire", str(active.id), "--store", store_url])
    assert retired.exit_code == 0, retired.output
    assert store.active_baseline(KEY) is None
    again, _ = run_on(store, "host-d", 5)
    assert store.active_baseline(KEY).result_id == again  # type: ignore[union-attr]
    missing = runner.invoke(app, ["results", "baseline", "pin", "999999", "--store", store_url])
    assert missing.exit_code != 0 and "no fingerprint to pin" in missing.output


def test_a_change_of_any_key_part_starts_a_new_baseline_and_none_compares(store: SqlStore) -> None:
    run_on(store, "host-a", 5)
    same = FingerprintCheck(key_parts=dict(PARTS), dtype="float32")
    assert same.key == KEY and store.active_baseline(same.key) is not None
    for part, value in [
        ("model", "other"),
        ("weights", "sha256:cd"),
        ("dtype", "bfloat16"),
        ("vllm", "0.33.0"),
        ("device", "NVIDIA H100 sm9.0"),
        ("tensor_parallel_size", 2),
        ("fixes", ["matmul_lora"]),
        ("probe_set", 2),
        ("top_k", 10),
    ]:
        changed = FingerprintCheck(key_parts={**PARTS, part: value}, dtype="float32")
        assert changed.key != KEY, part
        assert store.active_baseline(changed.key) is None, part


def test_a_schema_3_store_is_migrated_and_its_rows_have_no_fingerprint(store_url: str) -> None:
    old = SqlStore(create_store_engine(store_url), store_url)
    assert old.migrate(up_to=3) == [1, 2, 3]
    v3 = results_table(sa.MetaData(), schema_version=3)
    row = ResultRecord(verdict="pass", stage="done", profile_name="v3").model_dump(
        mode="json", exclude={"id", "fingerprint", "row_uuid", "gate"}
    )
    row["created_at"] = datetime.now(UTC)
    with old.engine.begin() as conn:
        kept = int(conn.execute(sa.insert(v3).values(**row).returning(v3.c.id)).scalar_one())
    old.close()
    upgraded = open_store(store_url)
    try:
        assert upgraded.schema_version() == 4
        record = upgraded.get(kept)
        assert record is not None and record.profile_name == "v3" and record.fingerprint is None
        with upgraded.engine.connect() as conn:
            inspector = sa.inspect(conn)
            assert "baselines" in inspector.get_table_names()
            assert "ix_results_fingerprint_key" in {i["name"] for i in inspector.get_indexes("results")}
        row_id, _ = run_on(upgraded, "host-a", 5)
        assert upgraded.get(row_id).fingerprint is not None  # type: ignore[union-attr]
    finally:
        upgraded.close()


# --- replayed rows are evidence, not verdicts (issue 43) ---------------------------------------------------


def forged(host: str, first_id: int, comparison: Comparison) -> ResultRecord:
    """A `pass` row whose fingerprint carries a comparison it was never given by any store."""
    mine = fingerprint(first_id)
    mine.comparison = comparison
    case = CaseResult(
        name="fingerprint", kind="fingerprint", endpoint="/v1/completions", model="m", passed=True
    )
    return ResultRecord(hostname=host, verdict="pass", stage="done", fingerprint=mine, cases=[case])


def forged_decides(agrees_with_row: int) -> Comparison:
    return Comparison(
        verdict="decides",
        diagnosis="two hosts against one",
        agrees_with_row=agrees_with_row,
        baseline_confirmed=False,
    )


def stored_by_uuid(store: SqlStore, row_uuid: str | None) -> ResultRecord:
    (found,) = [r for r in store.recent(limit=100) if r.row_uuid == row_uuid]
    return found


def test_a_planted_pass_row_with_a_forged_decides_never_retires_a_confirmed_baseline(
    store: SqlStore, store_url: str
) -> None:
    """The issue's case: a hostile local user's row in the spool, replayed by a read-only `results list`,
    retired the baseline two hosts had confirmed; a healthy GPU then compared `mismatch`, a faulty one
    `match`."""
    row_a, _ = run_on(store, "host-a", 5)
    run_on(store, "host-b", 5)  # confirmed
    row_x, _ = run_on(store, "host-x", 9)  # a faulty replica: its row failed, mismatch
    planted = forged("host-y", 9, forged_decides(row_x))
    keep(planted, store_url)

    listed = CliRunner().invoke(app, ["results", "list", "--store", store_url, "-f", "json"])
    assert listed.exit_code == 0, listed.output

    baseline = store.active_baseline(KEY)
    assert baseline is not None and (baseline.result_id, baseline.confirmed_by) == (row_a, "host-b")
    assert [b.status for b in store.baselines(KEY, include_retired=True)] == ["active"]
    replayed = stored_by_uuid(store, planted.row_uuid)
    assert replayed.fingerprint is not None and replayed.fingerprint.comparison is not None
    judged = replayed.fingerprint.comparison
    assert (judged.verdict, judged.baseline_row, judged.agrees_with_row) == ("mismatch", row_a, None)
    assert replayed.verdict == "fail" and replayed.diagnosis.startswith(
        "fingerprint: the fingerprint differs"
    )
    assert not replayed.cases[0].passed
    assert judge_against(fingerprint(5), baseline, store, "host-z").verdict == "match"
    assert judge_against(fingerprint(9), baseline, store, "host-z").verdict == "mismatch"


def test_a_live_row_s_own_comparison_never_retires_a_confirmed_baseline(store: SqlStore) -> None:
    row_a, _ = run_on(store, "host-a", 5)
    run_on(store, "host-b", 5)
    row_x, _ = run_on(store, "host-x", 9)
    row = store.add(forged("host-y", 9, forged_decides(row_x)))
    assert store.active_baseline(KEY).result_id == row_a  # type: ignore[union-attr]
    assert store.get(row).verdict == "fail"  # type: ignore[union-attr]


def test_a_decides_the_store_cannot_derive_never_replaces_a_provisional_baseline(store: SqlStore) -> None:
    """`decides` may replace only a provisional baseline, and only when the store finds the disputed
    candidate itself (on a third host): a row naming any row it likes (the baseline's own, none) is judged
    as it is, here `disputed`."""
    row_a, _ = run_on(store, "host-a", 9)
    for named in (row_a, 424242):
        row = store.add(forged("host-y", 5, forged_decides(named)))
        now = store.active_baseline(KEY)
        assert now is not None and (now.result_id, now.confirmed_by) == (row_a, None)
        stored = store.get(row)
        assert stored is not None and stored.verdict == "fail"
        assert stored.fingerprint.comparison.verdict == "disputed"  # type: ignore[union-attr]


def test_a_forged_match_is_judged_again_and_confirms_nothing(store: SqlStore) -> None:
    row_a, _ = run_on(store, "host-a", 5)
    claims = Comparison(verdict="match", diagnosis="matches", baseline_row=row_a, baseline_confirmed=True)
    row = store.add(forged("host-b", 9, claims))
    assert store.active_baseline(KEY).confirmed_by is None  # type: ignore[union-attr]
    assert store.get(row).fingerprint.comparison.verdict == "disputed"  # type: ignore[union-attr]
    # A row that compared with no store (`unchecked`) claims nothing: it neither founds nor confirms.
    store.retire_baseline(store.active_baseline(KEY).id)  # type: ignore[union-attr]
    store.add(forged("host-c", 5, Comparison(verdict="unchecked", diagnosis="not compared: --no-store")))
    assert store.active_baseline(KEY) is None
