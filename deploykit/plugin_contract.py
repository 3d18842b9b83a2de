"""The names deploykit's two sides agree on: the control side (`plan`, `serve`, `smoke`, `trace`, `render`)
and the vLLM-side plugin (`deploykit.vllm_plugin`, which runs inside vLLM's processes).

The two sides never import each other: vLLM reaches the plugin through its entry point, the control side
reaches it through environment variables, an HTTP route and trace files. Those names live here, on the
ground floor (this module imports nothing of deploykit), so renaming one changes both sides at once.
"""

from __future__ import annotations

# --- how vLLM finds the plugin ---------------------------------------------------------------------------

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "deploykit"
ENTRY_POINT = "deploykit.vllm_plugin.entry:register"
"""The value of deploykit's entry point (pyproject.toml); the wheel a chart carries and a host's vLLM
environment are checked for it."""

# --- the fixes ---------------------------------------------------------------------------------------------

FIXES_ENV = "DEPLOYKIT_FIXES"
"""Comma-separated fix names the plugin applies in every vLLM process; unset or empty: it does nothing."""

STATUS_PATH = "/deploykit/status"
"""The route the plugin adds to vLLM's API server: which fixes the engine processes applied."""

# --- the trace ---------------------------------------------------------------------------------------------

TRACE_ENV = "DEPLOYKIT_TRACE"
"""A directory: set (by `deploykit trace` only), the plugin hooks the model and writes trace files there."""

TRACE_MAX_STEPS_ENV = "DEPLOYKIT_TRACE_MAX_STEPS"
"""How many engine steps the hooks record per worker (default `TRACE_DEFAULT_MAX_STEPS`)."""

TRACE_DEFAULT_MAX_STEPS = 256

TRACE_FILE_GLOB = "trace-rank*.jsonl"
"""The trace files of one directory, one per worker process (schema: `deploykit.trace_records`)."""


def trace_file_name(rank: int, pid: int) -> str:
    """The file one worker writes: its tensor parallel rank and pid (a restarted worker gets a new one)."""
    return f"trace-rank{rank}-{pid}.jsonl"
