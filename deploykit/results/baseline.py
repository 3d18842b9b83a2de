"""What a baseline is: the fingerprint every run of one key is compared with, which row and host gave it,
and whether another host (or an operator) confirmed it. The SQL store keeps them (deploykit.results.sql)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deploykit.smoke.fingerprint import Fingerprint


class Baseline(BaseModel):
    """The fingerprint every run of one key is compared with: which row, from which host, since when."""

    model_config = ConfigDict(extra="forbid")

    id: int
    key: str
    key_parts: dict[str, Any]
    result_id: int
    hostname: str
    created_at: datetime
    status: Literal["active", "retired"]
    pinned: bool = False
    confirmed_by: str | None = Field(
        default=None, description="the other host (or `operator`) that agreed with it; None: provisional"
    )
    confirmed_at: datetime | None = None
    retired_at: datetime | None = None
    note: str = ""
    fingerprint: Fingerprint | None = None
