"""What the canary believes about the server, from the runs so far: a pure state machine (no clock, no I/O).

A wrong answer is corruption at once, and so is vLLM's NaN counter growing on live traffic; misses (timeouts,
refused connections, HTTP 5xx/429) count only after `miss_limit` in a row, and then say `saturated` when the
engine kept working meanwhile (its counters advanced: a deep queue, answers late, tokens flowing; the
replica stays ready) and `unreachable` only when no progress is seen; after a wrong answer (or a NaN
counted), healthy again only once a whole rotation has passed in a row. A hung engine (requests admitted,
no token produced for `defaults.HUNG_AFTER_S`; `deploykit.canary.progress` measures it) is `hung` at once:
not corruption, not a miss streak, but a server that only a restart brings back; a passing run, or the
server's restart, clears it. Corruption beats hung.

An answer that says the canary itself is set up wrong (HTTP 400, 401, 403, 404, 413, 422: a prompt longer than
the server's `--max-model-len`, a key the server does not take, a served name or adapter it does not serve)
is `misconfigured` at once: not healthy (nothing was judged), not corruption (the server answered the canary
correctly), so nothing restarts vLLM on it (issue 34). A `corrupt` or `hung` verdict stays through it; a
passing run clears it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from deploykit.canary.settings import DEFAULTS
from deploykit.smoke.judge import OUT_OF_RANGE_HINTS

if TYPE_CHECKING:
    from deploykit.smoke import SmokeReport
    from deploykit.smoke.models import CaseResult

Status = Literal["starting", "healthy", "saturated", "corrupt", "unreachable", "hung", "misconfigured"]
STATUSES: tuple[Status, ...] = (
    "starting",
    "healthy",
    "saturated",
    "corrupt",
    "unreachable",
    "hung",
    "misconfigured",
)
READY: frozenset[Status] = frozenset({"starting", "healthy", "saturated"})
"""The statuses in which the replica keeps its place behind the Service (`/healthz` 200): a saturated
replica is serving, and taking it out would only move its queue to the others (or strand it alone)."""
Outcome = Literal["pass", "wrong", "miss", "misconfigured"]
Cause = Literal["probe", "live_nan"]


MISCONFIGURED_HTTP = frozenset({400, 401, 403, 404, 413, 422})
"""HTTP statuses that refuse the canary's request itself (its length, key, model name or shape): they say
the canary and the server disagree about the setup, not that the server computes wrong answers."""


def misconfigured_case(case: CaseResult) -> bool:
    """A failed case whose answer refused the request (`MISCONFIGURED_HTTP`) and says nothing of NaN or
    infinite numbers (vLLM answers 400 when it cannot encode such a result: that stays corruption)."""
    if case.passed or case.miss or case.http_status not in MISCONFIGURED_HTTP:
        return False
    return not any(hint in case.diagnosis.lower() for hint in OUT_OF_RANGE_HINTS)


def outcome_of(report: SmokeReport) -> Outcome:
    """Wrong beats misconfigured beats miss: one wrong answer is corruption even when another request timed
    out or was refused; a run none of whose answers could be judged is never a pass."""
    failed = [case for case in report.cases if not case.passed]
    if not report.cases or any(not case.miss and not misconfigured_case(case) for case in failed):
        return "wrong"
    if any(misconfigured_case(case) for case in failed):
        return "misconfigured"
    if failed:
        return "miss"
    return "pass"


@dataclass
class CanaryState:
    """The status, the streaks that move it, and the diagnosis it shows."""

    rotation_len: int = 1
    miss_limit: int = DEFAULTS.miss_limit
    status: Status = "starting"
    consecutive_misses: int = 0
    passes_since_wrong: int = 0
    diagnosis: str = "no run yet"
    cause: Cause | None = None
    """Why the status is `corrupt`: a canary run's wrong answer, or vLLM's NaN counter on user traffic."""
    diagnosis_case: str = ""
    """The last miss's case and reason, for the saturated/unreachable diagnosis."""

    @property
    def healthy(self) -> bool:
        return self.status in ("starting", "healthy")

    @property
    def ready(self) -> bool:
        return self.status in READY

    @property
    def saturated(self) -> bool:
        return self.status == "saturated"

    @property
    def corrupt(self) -> bool:
        return self.status == "corrupt"

    @property
    def hung(self) -> bool:
        return self.status == "hung"

    @property
    def misconfigured(self) -> bool:
        return self.status == "misconfigured"

    def observe_misconfigured(self, diagnosis: str) -> Status | None:
        """The canary cannot judge for a reason of its own (its setup, its key, its own failure): say so,
        unless the server is already known corrupt or hung (those verdicts stay: they restart it)."""
        if self.status in ("corrupt", "hung"):
            return None
        before = self.status
        self.status, self.consecutive_misses, self.diagnosis = "misconfigured", 0, diagnosis
        return self.status if self.status != before else None

    def observe_hung(self, diagnosis: str) -> Status | None:
        """The engine made no progress for the bound while requests waited on it: `hung`, unless the
        output is already known corrupt (that verdict stays: it restarts the server too)."""
        if self.status in ("corrupt", "hung"):
            return None
        self.status, self.diagnosis = "hung", diagnosis
        return self.status

    def restarted(self) -> Status | None:
        """The server came back after not answering /health: the verdict was about the process that is
        gone, so start afresh (`starting`) when it was bad; returns the new status when it changed."""
        if self.status not in ("corrupt", "unreachable", "hung", "saturated"):
            return None
        self.status, self.consecutive_misses, self.passes_since_wrong = "starting", 0, 0
        self.cause = None
        self.diagnosis = "the server restarted (a new process); no run since"
        return self.status

    def observe_live_nan(self, grown: float, total: float) -> Status | None:
        """vLLM counted `grown` more user requests with NaN logits (its counter now `total`): corruption
        at once, whatever the runs said; healthy again by the same rule as after a wrong answer."""
        before = self.status
        self.status, self.passes_since_wrong, self.consecutive_misses = "corrupt", 0, 0
        self.cause = "live_nan"
        self.diagnosis = (
            f"live traffic: vLLM counted {grown:g} more request(s) with NaN logits "
            f"(vllm:corrupted_requests_total now {total:g})"
        )
        return self.status if self.status != before else None

    def observe_progressing(self, progressing: bool) -> Status | None:
        """The engine's counters did (or did not) advance lately: a miss streak says `saturated` while
        they do, `unreachable` once they do not. Other statuses are left alone."""
        if self.status == "unreachable" and progressing:
            self.status = "saturated"
            self.diagnosis = self._late_text(self.diagnosis_case)
            return self.status
        if self.status == "saturated" and not progressing:
            self.status = "unreachable"
            self.diagnosis = self._missed_text(self.diagnosis_case)
            return self.status
        return None

    def _late_text(self, last: str) -> str:
        return (
            f"{self.consecutive_misses} runs in a row got no answer in time while vLLM's counters "
            f"advanced (busy, not broken; the replica stays ready); last: {last}"
        )

    def _missed_text(self, last: str) -> str:
        return f"{self.consecutive_misses} runs in a row got no answer and no progress was seen; last: {last}"

    def observe(
        self, case: str, outcome: Outcome, diagnosis: str, progressing: bool = False
    ) -> Status | None:
        """Take one run's outcome (`progressing`: the engine's counters advanced lately); returns the new
        status when it changed."""
        before = self.status
        if outcome == "wrong":
            self.status, self.passes_since_wrong, self.consecutive_misses = "corrupt", 0, 0
            self.cause = "probe"
            self.diagnosis = f"{case}: {diagnosis}"
        elif outcome == "misconfigured":
            return self.observe_misconfigured(f"{case}: {diagnosis}")
        elif outcome == "miss":
            self.consecutive_misses += 1
            self.diagnosis_case = f"{case}: {diagnosis}"
            if self.status not in ("corrupt", "hung") and self.consecutive_misses >= self.miss_limit:
                self.status = "saturated" if progressing else "unreachable"
                late = self._late_text if progressing else self._missed_text
                self.diagnosis = late(self.diagnosis_case)
        else:
            self.consecutive_misses = 0
            if self.status == "corrupt":
                self.passes_since_wrong += 1
                if self.passes_since_wrong >= self.rotation_len:
                    self.status, self.cause = "healthy", None
            else:
                self.status = "healthy"
            if self.status == "healthy":
                self.diagnosis = f"{case}: {diagnosis}"
        return self.status if self.status != before else None
