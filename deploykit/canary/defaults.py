"""The canary's inner defaults and those of acting on its verdict, written once.

The settings a person sets (interval, timeout, NaN-counter reads, miss limit, listen address) are declared,
defaulted and bounded in `settings.CanarySettings`; these are the rest. The CLI's options (`deploykit
serve --on-corruption ...`), the canary itself, serving mode (`deploykit.serve.watch`) and the systemd
unit's restart (`deploykit.render.on_corruption`) read them here. Constants only, no imports beyond
`typing`: the CLI reads this module at import time.
"""

from __future__ import annotations

from typing import Literal

REQUEST_TIMEOUT_S = 120.0
"""Seconds per request when no profile gives its smoke timeout."""

HEARTBEAT_S = 3600.0
"""A row at least this often while nothing changes."""

RESTART_POLL_S = 2.0
"""How often `--watch-restarts` asks the server's /health."""

LIVEZ_HEALTH_TIMEOUT_S = 5.0
"""How long `/livez` waits for the server's own /health."""

IDENTIFY_TIMEOUT_S = 10.0
"""How long the first look at the server (is it vLLM?) waits for an answer."""

METRICS_TIMEOUT_S = 5.0
"""How long one read of vLLM's /metrics waits."""

HUNG_AFTER_S = 60.0
"""A hung engine: requests have waited this long with no token produced (vLLM's own token counters standing
still). A healthy engine step takes milliseconds to a few seconds, even at full batch or in a long prompt's
prefill chunk, so a minute without one token is no busy server; it is 5x below vLLM's own backstop
(`VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS`, 300 s, multiproc executor only), which kills the server instead of
restarting it. 0 turns the judgement off."""

PROGRESS_EVERY_S = 2.0
"""Seconds between reads of vLLM's token counters and queue gauges (`deploykit.canary.progress`)."""

PROGRESS_PAGE_MAX_BYTES = 8 * 1024 * 1024
"""The most of a /metrics page read for progress; vLLM's is tens of kilobytes."""

RUN_GRACE_S = 30.0
"""A run may take its requests' deadlines plus this before the canary's /livez calls it stuck."""

NAN_COUNTER = "vllm:corrupted_requests"
"""vLLM's counter of finished requests whose logits held NaN; exported only with `NAN_COUNTER_ENV`=1."""

NAN_COUNTER_ENV = "VLLM_COMPUTE_NANS_IN_LOGITS"
"""The environment variable that makes vLLM count NaN logits (the plan sets it unless a profile says no)."""

# --- acting on a corruption verdict (serve's in-process canary, the systemd canary unit) --------------

OnCorruption = Literal["restart", "stop", "ignore"]
ON_CORRUPTION_CHOICES: tuple[OnCorruption, ...] = ("restart", "stop", "ignore")
ON_CORRUPTION: OnCorruption = "restart"

MAX_RESTARTS_PER_HOUR = 3
"""Corruption restarts allowed within an hour; the next corruption stops the server instead."""

RESTART_WINDOW_S = 3600.0
"""The window `MAX_RESTARTS_PER_HOUR` counts in."""

RESTART_BACKOFF_S = 10.0
"""Seconds before the second restart in an hour (the first is at once), doubling after."""
