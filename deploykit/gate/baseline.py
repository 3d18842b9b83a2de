"""The stored side a candidate is compared with when no baseline server is given: the active baseline of the
profile's key, or, after an upgrade of the key's vLLM, of the same key under another release (pinned first,
then confirmed, then the newest); or one row an operator names (`--baseline-row`, a rollback's old baseline).
Its figures are the ones its row stored when it was a gate's adopted candidate; a baseline a `serve` founded
has answers but no figures."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deploykit.errors import UsageError
from deploykit.gate.model import Figures, GateReport, Side
from deploykit.results.baseline import Baseline
from deploykit.results.record import ResultRecord
from deploykit.results.store import Store

_RELEASE_PART = "vllm"


def same_but_release(parts: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    """Two keys that differ at most in the vLLM release."""
    keys = (set(parts) | set(other)) - {_RELEASE_PART}
    return all(parts.get(k) == other.get(k) for k in keys)


def pick(baselines: list[Baseline], key: str, parts: Mapping[str, Any]) -> Baseline | None:
    """The key's own active baseline, else the best one of the same key under another release."""
    exact = [b for b in baselines if b.key == key and b.status == "active"]
    if exact:
        return exact[0]
    kin = [b for b in baselines if b.status == "active" and same_but_release(b.key_parts, parts)]
    kin.sort(key=lambda b: (b.pinned, b.confirmed_by is not None, b.created_at), reverse=True)
    return kin[0] if kin else None


def stored_side(store: Store, key: str, parts: Mapping[str, Any], row_id: int | None) -> Side:
    """The baseline side from the store: row `row_id`, or the baseline `pick` finds for the key."""
    if row_id is not None:
        record = store.get(row_id)
        if record is None or record.unreadable:
            raise UsageError(f"--baseline-row {row_id}: no readable row with that id in {store.display_url}")
        if record.fingerprint is None:
            raise UsageError(f"--baseline-row {row_id}: the row has no fingerprint to compare with")
        return _side_from_row(record, f"stored row #{row_id}")
    found = pick(store.baselines(include_retired=False), key, parts)
    if found is None:
        raise UsageError(
            f"no baseline for key {key[:12]} (nor for it under another vLLM release) in {store.display_url}: "
            "pass --baseline-url URL (a running baseline server), --launch-baseline, or --baseline-row ID"
        )
    baseline = store.active_baseline(found.key)
    record = store.get(found.result_id)
    if baseline is None or baseline.fingerprint is None or record is None or record.unreadable:
        raise UsageError(
            f"baseline #{found.id} of key {found.key[:12]} cannot be read from {store.display_url}"
        )
    state = "pinned" if baseline.pinned else ("confirmed" if baseline.confirmed_by else "provisional")
    side = _side_from_row(record, f"stored baseline #{baseline.id} ({state}, row #{baseline.result_id})")
    side.fingerprint = baseline.fingerprint
    side.key, side.key_parts = baseline.key, dict(baseline.key_parts)
    return side


def _side_from_row(record: ResultRecord, source: str) -> Side:
    """A stored row as a side: its fingerprint and, for a gate's row, the figures of the side it adopted."""
    assert record.fingerprint is not None
    figures: Figures | None = None
    if record.gate is not None:
        report = GateReport.model_validate(record.gate)
        figures = report.candidate.figures
    return Side(
        role="baseline",
        source=source,
        vllm_version=record.fingerprint.key_parts.get(_RELEASE_PART),
        key=record.fingerprint.key,
        key_parts=dict(record.fingerprint.key_parts),
        fixes_active=record.fixes_active,
        fingerprint=record.fingerprint,
        figures=figures,
    )
