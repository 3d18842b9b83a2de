"""What the canary believes about the server, from the runs so far: a pure state machine (no clock, no I/O).

A wrong answer is corruption at once, and so is vLLM's NaN counter growing on live traffic; misses (timeouts,
refused connections, HTTP 5xx/429) count only after `miss_limit` in a row; after a wrong answer (or a NaN
counted), healthy again only once a whole rotation has passed in a row. A hung engine (requests admitted,
no token produced for `defaults.HUNG_AFTER_S`; `deploykit.canary.progress` measures it) is `hung` at once:
not corruption, not a miss streak, but a server that only a restart brings back; a passing run, or the
server's restart, clears it. Corruption beats hung.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from deploykit.canary.defaults import MISS_LIMIT

if TYPE_CHECKING:
    from deploykit.smoke import SmokeReport

Status = Literal["starting", "healthy", "corrupt", "unreachable", "hung"]
Outcome = Literal["pass", "wrong", "miss"]
Cause = Literal["probe", "live_nan"]


def outcome_of(report: SmokeReport) -> Outcome:
    """Wrong beats miss: one wrong answer is corruption even when another request timed out."""
    if any(not case.passed and not case.miss for case in report.cases) or not report.cases:
        return "wrong"
    if any(not case.passed for case in report.cases):
        return "miss"
    return "pass"


@dataclass
class CanaryState:
    """The status, the streaks that move it, and the diagnosis it shows."""

    rotation_len: int = 1
    miss_limit: int = MISS_LIMIT
    status: Status = "starting"
    consecutive_misses: int = 0
    passes_since_wrong: int = 0
    diagnosis: str = "no run yet"
    cause: Cause | None = None
    """Why the status is `corrupt`: a canary run's wrong answer, or vLLM's NaN counter on user traffic."""

    @property
    def healthy(self) -> bool:
        return self.status in ("starting", "healthy")

    @property
    def corrupt(self) -> bool:
        return self.status == "corrupt"

    @property
    def hung(self) -> bool:
        return self.status == "hung"

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
        if self.status not in ("corrupt", "unreachable", "hung"):
            return None
        self.status, self.consecutive_misses, self.passes_since_wrong = "starting", 0, 0
        self.cause = None
        self.diagnosis = "the server restarted (its /health went away and came back); no run since"
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

    def observe(self, case: str, outcome: Outcome, diagnosis: str) -> Status | None:
        """Take one run's outcome; returns the new status when it changed."""
        before = self.status
        if outcome == "wrong":
            self.status, self.passes_since_wrong, self.consecutive_misses = "corrupt", 0, 0
            self.cause = "probe"
            self.diagnosis = f"{case}: {diagnosis}"
        elif outcome == "miss":
            self.consecutive_misses += 1
            if self.status not in ("corrupt", "hung") and self.consecutive_misses >= self.miss_limit:
                self.status = "unreachable"
                self.diagnosis = (
                    f"{self.consecutive_misses} runs in a row got no answer; last: {case}: {diagnosis}"
                )
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
