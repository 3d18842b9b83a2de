"""The names deploykit's two sides agree on: the control side (`plan`, `serve`, `smoke`, `trace`, `render`)
and the vLLM-side plugin (`deploykit.vllm_plugin`, which runs inside vLLM's processes).

The two sides never import each other: vLLM reaches the plugin through its entry point, the control side
reaches it through environment variables, an HTTP route and trace files. Those names live here, on the
ground floor (this module imports nothing of deploykit), so renaming one changes both sides at once. So does
the status route's per-rank record (`RankStatus`): the vLLM side writes it, the fix check reads it.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

# --- how vLLM finds the plugin ---------------------------------------------------------------------------

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_NAME = "deploykit"
ENTRY_POINT = "deploykit.vllm_plugin.entry:register"
"""The value of deploykit's entry point (pyproject.toml); the wheel a chart carries and a host's vLLM
environment are checked for it."""

PLUGINS_ENV = "VLLM_PLUGINS"
"""vLLM's own list of the plugins it loads, when set: one that leaves ENTRY_POINT_NAME out runs no fix (a
profile's env is checked for it; the release report checks vLLM still reads it)."""

# --- the fixes ---------------------------------------------------------------------------------------------

FIXES_ENV = "DEPLOYKIT_FIXES"
"""Comma-separated fix names the plugin applies in every vLLM process; unset or empty: it does nothing."""

STATUS_PATH = "/deploykit/status"
"""The route the plugin adds to vLLM's API server: which fixes the engine processes applied."""

STATUS_RPC_METHOD = "deploykit_status"
"""The engine-side method the route asks every worker over vLLM's `collective_rpc`. A rank without it (its
vLLM did not load the plugin with a fix named) makes the whole RPC fail with `... has no attribute
'deploykit_status'`, which the fix check reads as such."""


class RankStatus(BaseModel):
    """One engine process's answer to the status RPC: where it sits in vLLM's world, and the fixes deploykit's
    plugin applied in it. Per rank, because with tensor or pipeline parallelism (and across nodes) each rank
    is its own process with its own environment: one that missed a fix computes its shard unfixed.

    Reading ignores keys it does not know and leaves out those it lacks: an older deploykit answers only pid,
    rank (then the executor-local rank) and fixes_applied. Strict types: a rank that is a string or a boolean
    is a malformed answer, not a rank.
    """

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    pid: int
    rank: int | None = Field(
        default=None, ge=0, description="global rank in the engine's world (every node); None: not a worker"
    )
    local_rank: int | None = Field(default=None, ge=0, description="rank among its node's workers")
    tp_rank: int | None = Field(default=None, ge=0, description="rank in its tensor parallel group")
    pp_rank: int | None = Field(default=None, ge=0, description="rank in its pipeline parallel group")
    node_rank: int | None = Field(default=None, ge=0, description="vLLM's --node-rank of its node")
    hostname: str | None = Field(default=None, max_length=255)
    fixes_requested: list[str] | None = Field(
        default=None, description="the fixes its own DEPLOYKIT_FIXES names; None: not reported"
    )
    fixes_applied: dict[str, str] = Field(default_factory=dict, description="fix → the target it patched")

    def label(self) -> str:
        """`rank 1 (tp 1, pp 0, node 1, host gpu-b)`: how a diagnosis names the rank (what is known of it)."""
        parts = [
            f"{word} {value}"
            for word, value in (
                ("tp", self.tp_rank),
                ("pp", self.pp_rank),
                ("node", self.node_rank),
                ("host", self.hostname),
                ("pid", None if self.rank is not None else self.pid),
            )
            if value is not None
        ]
        name = "an engine process" if self.rank is None else f"rank {self.rank}"
        return f"{name} ({', '.join(parts)})" if parts else name


MAX_WORLD_SIZE = 65536
"""More ranks than any engine has: a `world` above it is malformed (the reader lists the world's ranks)."""


class WorldShape(BaseModel):
    """The engine's parallel layout from its own config: `size` ranks must answer the status RPC."""

    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)

    size: int = Field(
        ge=1,
        le=MAX_WORLD_SIZE,
        description="world size of one engine: tensor × pipeline (× context) parallel",
    )
    tensor_parallel_size: int | None = Field(default=None, ge=1)
    pipeline_parallel_size: int | None = Field(default=None, ge=1)
    nnodes: int | None = Field(default=None, ge=1)


def unanswered_ranks(world_size: int, answered: Iterable[int | None]) -> list[int]:
    """The ranks of a world of `world_size` that no answer came from: both sides' rule for "every rank"."""
    return sorted(set(range(world_size)) - {rank for rank in answered if rank is not None})


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
