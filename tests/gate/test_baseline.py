"""The gate and the results store, on both back-ends: which stored baseline a candidate meets (its key, or the
same key under another vLLM release), where its figures come from, and the replay rule: a gate's row moves no
baseline by itself (live or replayed from the spool); only `--adopt` on a promote does, and the baseline it
replaces stays readable."""

from __future__ import annotations

import pytest

from deploykit.errors import UsageError
from deploykit.fleet_baseline import key_digest
from deploykit.gate.baseline import pick, stored_side
from deploykit.gate.model import Figures, GateReport
from deploykit.gate.run import _store_and_adopt
from deploykit.results.record import ResultRecord
from deploykit.results.spool import keep
from deploykit.results.sql.store import SqlStore, open_store
from tests.gate.sides import PARTS, fingerprint, point, side

KEY = key_digest(PARTS)


def founded(store: SqlStore, parts: dict[str, object] | None = None, first_id: int = 5) -> int:
    """A `serve` row that becomes its key's baseline, as a first healthy start does."""
    parts = dict(parts or PARTS)
    fp = fingerprint([first_id, 6, 7], [0.5, 0.5, 0.5])
    fp.key, fp.key_parts = key_digest(parts), parts
    return store.add(ResultRecord(command="serve", verdict="pass", stage="done", fingerprint=fp))


def gate_record(
    verdict: str = "promote", parts: dict[str, object] | None = None
) -> tuple[ResultRecord, GateReport]:
    parts = dict(parts or PARTS)
    candidate = side(**{k: v for k, v in parts.items() if k in ("vllm", "dtype")})
    assert candidate.fingerprint is not None
    candidate.fingerprint.key, candidate.fingerprint.key_parts = key_digest(parts), parts
    candidate.key, candidate.key_parts = key_digest(parts), parts
    report = GateReport(
        verdict=verdict,  # type: ignore[arg-type]
        reason=None if verdict == "promote" else "slower",
        summary="test",
        profile="demo-cpu",
        baseline=side("baseline"),
        candidate=candidate,
        slower_threshold=0.25,
    )
    record = ResultRecord(
        command="gate",
        verdict="pass" if verdict == "promote" else "fail",
        stage="done",
        fingerprint=candidate.fingerprint,
        gate=report.model_dump(mode="json"),
    )
    return record, report


def test_a_gates_row_founds_no_baseline_even_when_it_passes_on_a_new_key(store: SqlStore) -> None:
    record, _ = gate_record(parts={**PARTS, "vllm": "0.33.0"})
    row = store.add(record)
    assert store.baselines() == []
    stored = store.get(row)
    assert stored is not None and stored.command == "gate" and stored.gate is not None
    assert stored.fingerprint is not None and stored.fingerprint.comparison is not None
    assert stored.fingerprint.comparison.verdict == "new"  # judged as every row is, and nothing more


def test_adopt_pins_a_promoted_candidate_and_the_replaced_baseline_stays_readable(store: SqlStore) -> None:
    founded(store)
    old = store.baselines()[0]
    record, report = gate_record()
    said: list[str] = []
    _store_and_adopt(record, report, store, True, said.append)
    assert report.row_id is not None and report.adopted_baseline is not None
    active = store.active_baseline(KEY)
    assert active is not None and active.id == report.adopted_baseline and active.pinned
    assert active.result_id == report.row_id and "adopted by deploykit gate" in active.note
    retired = [b for b in store.baselines(include_retired=True) if b.id == old.id]
    assert retired and retired[0].status == "retired"
    assert any("stays readable" in line for line in said)


def test_a_held_candidate_is_never_adopted(store: SqlStore) -> None:
    founded(store)
    record, report = gate_record(verdict="hold")
    said: list[str] = []
    _store_and_adopt(record, report, store, True, said.append)
    assert report.adopted_baseline is None
    assert said[-1] == "not adopted: the verdict is hold: slower"
    assert store.active_baseline(KEY).result_id != report.row_id  # type: ignore[union-attr]


def test_a_spooled_gate_row_replayed_later_moves_no_baseline(store_url: str) -> None:
    record, _ = gate_record(parts={**PARTS, "vllm": "0.33.0"})  # a key with no baseline: it would found one
    keep(record, store_url)  # the store was away when the gate ended
    store = open_store(store_url)  # the next command that reaches it replays the spool
    try:
        assert store.replayed == 1
        (replayed,) = [r for r in store.recent() if r.row_uuid == record.row_uuid]
        assert replayed.command == "gate" and replayed.passed
        assert store.baselines(include_retired=True) == []
    finally:
        store.close()


def test_after_an_upgrade_the_same_key_under_the_old_release_is_the_baseline(store: SqlStore) -> None:
    old_release = {**PARTS, "vllm": "0.31.0+cpu"}
    founded(store, old_release)
    new_key_parts = {**PARTS, "vllm": "0.32.0+cpu"}
    found = stored_side(store, key_digest(new_key_parts), new_key_parts, None)
    assert found.key == key_digest(old_release) and found.vllm_version == "0.31.0+cpu"
    assert found.source.startswith("stored baseline #") and "provisional" in found.source
    assert found.figures is None  # a serve founded it: answers, no figures


def test_another_model_or_dtype_is_never_taken_for_the_baseline(store: SqlStore) -> None:
    founded(store, {**PARTS, "dtype": "bfloat16"})
    with pytest.raises(UsageError, match="no baseline for key"):
        stored_side(store, KEY, PARTS, None)


def test_a_pinned_baseline_wins_over_a_newer_provisional_one_of_another_release(store: SqlStore) -> None:
    pinned_row = founded(store, {**PARTS, "vllm": "0.30.0"})
    store.pin_baseline(pinned_row)
    founded(store, {**PARTS, "vllm": "0.31.0"}, first_id=8)
    chosen = pick(store.baselines(), KEY, PARTS)
    assert chosen is not None and chosen.result_id == pinned_row


def test_an_adopted_gate_row_brings_its_figures_and_a_named_row_is_a_rollback(store: SqlStore) -> None:
    record, report = gate_record()
    report.candidate.figures = Figures(load=[point(4, 777)], kv_cache_tokens=1234)
    record.gate = report.model_dump(mode="json")
    _store_and_adopt(record, report, store, True, lambda _: None)
    found = stored_side(store, KEY, PARTS, None)
    assert found.figures is not None and found.figures.kv_cache_tokens == 1234
    assert found.figures.at(4) is not None and found.figures.at(4).tokens_per_s == 777  # type: ignore[union-attr]
    by_row = stored_side(store, KEY, PARTS, report.row_id)
    assert by_row.source == f"stored row #{report.row_id}"
    with pytest.raises(UsageError, match="no readable row"):
        stored_side(store, KEY, PARTS, 999_999)


def test_a_gate_row_keeps_the_gates_verdict_and_carries_the_stores_own_comparison(store: SqlStore) -> None:
    founded(store)  # the key's baseline answers 5, 6, 7
    record, _ = gate_record()
    assert record.fingerprint is not None
    record.fingerprint.answers[0].ids[0] = 9  # the candidate differs (a drift a person accepted)
    row = store.get(store.add(record))
    assert row is not None and row.verdict == "pass"  # a serve row would be stored `fail` (the replay rule)
    assert row.fingerprint is not None and row.fingerprint.comparison is not None
    assert row.fingerprint.comparison.verdict in ("mismatch", "disputed")
    assert store.active_baseline(KEY).result_id != row.id  # type: ignore[union-attr]
