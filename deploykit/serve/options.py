"""What `deploykit serve` is asked to do: the attempt (profile, fixes, port, store, log directory) and, in
serving mode, the in-process canary (its settings: `deploykit.canary.settings.CanarySettings`) and what to do
on corruption. Its defaults are the canary's own, written once."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from deploykit.canary import defaults as canary_defaults
from deploykit.canary.defaults import OnCorruption
from deploykit.canary.settings import DEFAULTS, CanarySettings
from deploykit.profile.schema import FixMode


class ServeOptions(BaseModel):
    """What the `serve` command was asked to do."""

    model_config = ConfigDict(extra="forbid")

    profile: str
    overrides: dict[str, FixMode] = Field(default_factory=dict)
    check: bool = False
    port: int | None = Field(default=None, ge=1, le=65535)
    store_url: str | None = None
    quiet: bool = True  # vLLM's log in its file only; `--verbose` streams it (serve/console.py)
    log_dir: Path | None = None
    # Serving mode only (not --check): the in-process canary and what to do on corruption (serve/watch.py).
    canary: CanarySettings | None = DEFAULTS
    """The in-process canary's settings (`--canary-every`, `--canary-listen`); None: no canary
    (`--canary-every 0`)."""
    canary_http: bool = False
    """It answers `/healthz`, `/livez` and `/metrics` on `canary.listen` (`--canary-listen` was given)."""
    on_corruption: OnCorruption = canary_defaults.ON_CORRUPTION
    max_restarts_per_hour: int = Field(default=canary_defaults.MAX_RESTARTS_PER_HOUR, ge=0)
    restart_backoff_s: float = Field(default=canary_defaults.RESTART_BACKOFF_S, ge=0)

    @property
    def serving(self) -> bool:
        """Keeps serving after a passing verdict (not `--check`)."""
        return not self.check

    @property
    def canary_listens(self) -> bool:
        """The in-process canary runs and answers `/healthz` and `/metrics` on `canary.listen`."""
        return self.serving and self.canary is not None and self.canary_http
