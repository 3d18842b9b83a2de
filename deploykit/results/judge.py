"""A fingerprint judged against its key's baseline: match, mismatch, disputed, or the third replica that
decides. Apart from deploykit.fleet_baseline (which takes fingerprints and keys them by a plan) so that the
store judges again, under the key's lock, every fingerprint it writes (`SqlStore.add`): what a row says it
compared is evidence, never the verdict that moves a baseline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from deploykit.smoke.fingerprint import Comparison, Fingerprint, compare

if TYPE_CHECKING:
    from deploykit.results.baseline import Baseline
    from deploykit.results.record import ResultRecord

CASE_NAME = "fingerprint"


class DisputedRows(Protocol):
    """Where the disputed candidates of a key are found: a `Store`, or the store's own transaction."""

    def disputed(self, key: str, since_row: int, limit: int = 50) -> list[ResultRecord]: ...


def _describe_baseline(baseline: Baseline) -> str:
    when = baseline.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    status = (
        f"pinned by {baseline.confirmed_by}"
        if baseline.pinned
        else f"confirmed by {baseline.confirmed_by}"
        if baseline.confirmed_by
        else "provisional: no other host has agreed yet"
    )
    row = f"row #{baseline.result_id} from host {baseline.hostname}"
    return f"baseline #{baseline.id}: {row} at {when}, {status}"


def judge_against(
    fingerprint: Fingerprint, baseline: Baseline | None, store: DisputedRows | None, hostname: str
) -> Comparison:
    """The verdict of `fingerprint` against `baseline` (the key's active one), and for a provisional baseline
    from another host that disagrees, against the disputed candidates since: the third decides."""
    if baseline is None or baseline.fingerprint is None:
        return Comparison(verdict="new", diagnosis="no baseline for this key yet: a passing run becomes it")
    reference = baseline.fingerprint
    tolerance = max(reference.tolerance, fingerprint.tolerance)
    found = dict(
        baseline_id=baseline.id,
        baseline_row=baseline.result_id,
        baseline_host=baseline.hostname,
        baseline_at=baseline.created_at.isoformat(),
        baseline_confirmed=bool(baseline.confirmed_by or baseline.pinned),
    )
    mismatch, ties = compare(reference.answers, fingerprint.answers, tolerance)
    if mismatch is None:
        skipped = f" ({ties} near-tie position(s) not counted)" if ties else ""
        return Comparison(
            verdict="match", diagnosis=f"matches {_describe_baseline(baseline)}{skipped}", **found
        )
    where = mismatch.describe(tolerance)
    trusted = baseline.confirmed_by is not None or baseline.pinned or baseline.hostname == hostname
    if trusted:
        return Comparison(
            verdict="mismatch",
            diagnosis=f"the fingerprint differs from {_describe_baseline(baseline)}: {where}; this "
            f"deployment computes different answers than a healthy one of the same key (host {hostname})",
            **found,
        )
    for candidate in store.disputed(baseline.key, baseline.result_id) if store is not None else []:
        theirs = candidate.fingerprint
        if candidate.hostname in (hostname, baseline.hostname) or theirs is None or candidate.id is None:
            continue
        if compare(theirs.answers, fingerprint.answers, max(tolerance, theirs.tolerance))[0] is None:
            return Comparison(
                verdict="decides",
                diagnosis=f"agrees with row #{candidate.id} from host {candidate.hostname}, not with "
                f"{_describe_baseline(baseline)} ({where}): two hosts against one, so row #{candidate.id} "
                f"becomes the baseline and host {baseline.hostname} is the odd one out",
                agrees_with_row=candidate.id,
                **found,
            )
    return Comparison(
        verdict="disputed",
        diagnosis=f"the fingerprint differs from {_describe_baseline(baseline)}: {where}; with no confirmed "
        f"baseline either this host ({hostname}) or {baseline.hostname} is wrong, and deploykit picks "
        "neither: a third replica of the same key decides, or an operator runs "
        "`deploykit results baseline pin ROW`",
        **found,
    )
