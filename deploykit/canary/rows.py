"""The canary's rows in the results store: one when its state changes (the first verdict included) and an
hourly heartbeat, never one per run. They are stored by `deploykit.results.store_row`: a store that cannot
be reached is one line and the row spooled (deploykit.results.spool), written when the store is back; the
checking goes on."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from deploykit.canary.state import CanaryState
    from deploykit.results.record import ResultRecord
    from deploykit.smoke import SmokeReport
    from deploykit.smoke.fingerprint import Fingerprint


def canary_record(
    stage: str,
    state: CanaryState,
    report: SmokeReport,
    now: float,
    *,
    url: str,
    every_s: float,
    runs: int,
    profile_name: str | None,
    profile_id: str | None,
    fingerprint: Fingerprint | None = None,
) -> ResultRecord:
    """The row for `state` after a run (or a server restart) at `now`; with the run's fingerprint, the
    first healthy row of a key that has no baseline yet becomes it (`Store.add`)."""
    from datetime import UTC, datetime

    from deploykit import __version__
    from deploykit.results.record import ResultRecord

    return ResultRecord(
        created_at=datetime.fromtimestamp(now, UTC),
        command="canary",
        profile_name=profile_name,
        profile_id=profile_id,
        verdict="pass" if state.healthy else "fail",
        stage=stage,
        diagnosis=f"{state.status}: {state.diagnosis}",
        base_url=url,
        versions={"deploykit": __version__},
        timings={
            "runs": float(runs),
            "every_s": every_s,
            "consecutive_misses": float(state.consecutive_misses),
            "run_s": round(report.elapsed_s, 4),
        },
        cases=report.cases,
        fingerprint=fingerprint,
    )
