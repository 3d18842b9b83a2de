"""What a gate run is, at every boundary: the figures of one side, the two sides, the findings and the
verdict. The store keeps the whole report with the gate's row (its `gate` column); `--format json` prints it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deploykit.smoke.fingerprint import Fingerprint
from deploykit.smoke.models import CaseResult

Role = Literal["baseline", "candidate"]
Reason = Literal["drift", "slower", "broken"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoadPoint(_Strict):
    """The load sample at one stream count."""

    streams: int
    requests: int
    output_tokens: int = Field(description="tokens that arrived, all requests together")
    wall_s: float
    tokens_per_s: float
    tpot_ms: float | None = Field(
        default=None,
        description="time per output token after the first: the server's mean inter-token latency over the "
        "sample (`server`), else the median of the client's per-request TPOT (`client`)",
    )
    tpot_source: Literal["server", "client"] = "client"
    samples: int = Field(default=1, description="samples this point is the best of")
    tokens_per_s_worst: float | None = Field(
        default=None, description="the lowest throughput of those samples"
    )
    tpot_ms_worst: float | None = Field(default=None, description="the highest TPOT of those samples")
    ttft_ms: float | None = Field(default=None, description="median time to the first token")
    problem: str = Field(default="", description="requests that failed or came back short")


class Figures(_Strict):
    """A side's speed and capacity: what `hold: slower` is judged on."""

    load: list[LoadPoint] = Field(default_factory=list)
    kv_cache_tokens: int | None = Field(
        default=None,
        description="KV-cache capacity in tokens (vLLM's cache_config_info: blocks × block size)",
    )
    startup_s: float | None = Field(
        default=None, description="launch to /health 200 (a side deploykit started)"
    )

    def at(self, streams: int) -> LoadPoint | None:
        return next((p for p in self.load if p.streams == streams), None)


class Side(_Strict):
    """One side as measured in this run, or as stored."""

    role: Role
    source: str = Field(description="`url`, `launched`, `stored baseline #N (row #M)`")
    url: str | None = Field(default=None, description="redacted")
    vllm_version: str | None = None
    key: str | None = None
    key_parts: dict[str, Any] = Field(default_factory=dict)
    fixes_active: dict[str, str] | None = None
    cases: list[CaseResult] = Field(default_factory=list)
    fingerprint: Fingerprint | None = None
    figures: Figures | None = None
    problem: str = Field(default="", description="why this side could not be measured (broken)")

    @property
    def failed_cases(self) -> list[CaseResult]:
        return [case for case in self.cases if not case.passed]


class Drift(_Strict):
    """Where the candidate's answers first part from the baseline's."""

    case: str = Field(description="the probe (or known answer) where they part")
    position: int
    expected_id: int
    got_id: int | None
    logprob_delta: float | None = None
    token: int | None = None
    baseline_gap: float | None = Field(description="the baseline's top-1/top-2 logprob gap there (nats)")
    near_tie: bool = Field(description="the gap is under the tie margin (2 × tolerance)")
    tolerance: float
    near_ties_skipped: int = 0
    text: str


class SpeedFinding(_Strict):
    """One figure on both sides (each side's best sample); `ratio` is candidate / baseline. `baseline_worst`:
    the baseline's worst sample, the noise the candidate must also fall outside of to be slower."""

    metric: str = Field(description="`tokens_per_s`, `tpot_ms`, `kv_cache_tokens` or `startup_s`")
    streams: int | None = None
    baseline: float
    candidate: float
    baseline_worst: float | None = None
    ratio: float
    higher_is_better: bool
    judged: bool = Field(description="false: reported only (start-up time)")
    slower: bool


class GateReport(_Strict):
    verdict: Literal["promote", "hold"]
    reason: Reason | None = None
    summary: str
    profile: str
    baseline: Side
    candidate: Side
    changed: dict[str, list[Any]] = Field(
        default_factory=dict, description="key parts that differ: part → [baseline's, candidate's]"
    )
    drift: Drift | None = None
    fingerprint_tolerance: float | None = None
    fingerprint_clear: list[int] | None = Field(
        default=None,
        description="[clear, all]: the baseline's probe positions that lead by more than the tie margin at "
        "that tolerance (their ids must match), of all",
    )
    speed: list[SpeedFinding] = Field(default_factory=list)
    speed_judged: bool = False
    slower_threshold: float
    accepted_drift: bool = False
    adopted_baseline: int | None = Field(
        default=None,
        description="the baseline `--adopt` made of this row (the printed report; the stored copy is written "
        "before the adoption, so it says None there: the baselines table names the row)",
    )
    row_id: int | None = Field(default=None, description="this gate's row (the printed report only)")
    elapsed_s: float = 0.0

    @property
    def label(self) -> str:
        """`promote`, or `hold: REASON`: the verdict as people and pipelines read it."""
        return self.verdict if self.reason is None else f"{self.verdict}: {self.reason}"
