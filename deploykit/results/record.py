"""What a row of the results store is: one attempt (`deploykit serve`, `smoke`, `trace`) or one canary
state change, whatever its outcome. Only pydantic and the smoke's records: building one needs no store and no
SQLAlchemy (the vLLM image's sidecars build rows with `--no-store`).
"""

from __future__ import annotations

import re
import socket
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from deploykit.net import redact_url
from deploykit.smoke import CaseResult
from deploykit.smoke.fingerprint import Fingerprint

Verdict = Literal["pass", "fail", "error", "interrupted", "unreadable"]
"""`unreadable` is never written: the reader gives it to a row it cannot read (`sql.rows.decode_row`)."""
Command = Literal["serve", "smoke", "canary", "trace", "gate", "unknown"]
"""`unknown` is never written: an unreadable row whose command this deploykit does not know."""
UNREADABLE: Verdict = "unreadable"
_FINGERPRINT_KEY = re.compile(r"[0-9a-f]{1,64}")
"""A key as `deploykit.fleet_baseline.key_digest` makes it: PostgreSQL's lock for it reads it as hex."""


class ResultRecord(BaseModel):
    """One attempt. Secrets never reach it: env values are `${NAME}` references, logs are redacted."""

    model_config = ConfigDict(extra="forbid")

    id: int | None = None
    row_uuid: str | None = Field(
        default_factory=lambda: uuid.uuid4().hex,
        pattern=r"^[0-9a-f]{32}$",  # also a spool file's name: nothing else may reach a path
        description="this attempt's own id, unique in the store: a spooled row replayed twice is written "
        "once (None: a row an older deploykit wrote)",
    )
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    command: Command = "serve"
    hostname: str = Field(default_factory=socket.gethostname)
    profile_name: str | None = None
    profile_id: str | None = None
    verdict: Verdict
    stage: str = Field(description="where the attempt ended: profile, plan, launch, startup, smoke, done")
    diagnosis: str = ""
    base_url: str | None = None
    facts: dict[str, Any] | None = None
    plan: dict[str, Any] | None = Field(default=None, description="argv, env (redacted), fixes, model path")
    versions: dict[str, str | None] = Field(default_factory=dict)
    timings: dict[str, float | None] = Field(default_factory=dict)
    cases: list[CaseResult] = Field(default_factory=list)
    fixes_active: dict[str, str] | None = Field(
        default=None,
        description="fix → patched target as GET /deploykit/status reported them ({} when deploykit's "
        "plugin is not loaded); None when the server was not asked (the attempt ended earlier)",
    )
    log_path: str | None = None
    log_tail: str = ""
    fingerprint: Fingerprint | None = Field(
        default=None, description="the probe set's answers, their key and the comparison with its baseline"
    )
    gate: dict[str, Any] | None = Field(
        default=None,
        description="`deploykit gate`'s whole report (deploykit.gate.model.GateReport): both sides, the "
        "findings and the verdict; None for every other command",
    )

    @field_validator("base_url")
    @classmethod
    def _no_password(cls, url: str | None) -> str | None:
        """A URL given with `user:pw@` or `?password=` is stored (and so printed) without the secret."""
        return None if url is None else redact_url(url)

    @field_validator("fingerprint")
    @classmethod
    def _a_key_is_a_key(cls, fingerprint: Fingerprint | None) -> Fingerprint | None:
        """A fingerprint key that is not one (a forged spool file's) stops here, never in the store."""
        if fingerprint is not None and not _FINGERPRINT_KEY.fullmatch(fingerprint.key):
            raise ValueError(
                f"its key {fingerprint.key[:40]!r} is not a fingerprint key (lowercase hex, 1 to 64 digits)"
            )
        return fingerprint

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def unreadable(self) -> bool:
        """A row this deploykit could not read: its id and time are real, its diagnosis says why."""
        return self.verdict == UNREADABLE
