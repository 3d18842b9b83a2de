"""What one vLLM process answers to the status RPC: its place in vLLM's world and the fixes applied in it.

With tensor or pipeline parallelism each rank is a process of its own, and across nodes (`--nnodes`, the
workers `--headless`) each node's ranks come from a launch of their own, with their own DEPLOYKIT_FIXES. A
rank that missed a fix computes its shard unfixed, so each one says who it is (`plugin_contract.RankStatus`):
the global rank the executor gave it, its tensor and pipeline parallel ranks, its node and host.

Nothing is imported to find this out: a worker has vLLM's distributed state loaded by the time the RPC
arrives, and anything not there is reported unknown (None) rather than guessed.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from deploykit.fixes.base import FixError
from deploykit.plugin_contract import RankStatus
from deploykit.vllm_plugin.applied import applied_fixes, requested_fixes


def process_record(wrapper: Any = None) -> dict[str, Any]:
    """This process's `RankStatus`, as the plain dict that crosses vLLM's RPC; `wrapper` is the worker's
    `WorkerWrapperBase` (None in the API server, which holds no rank)."""
    try:
        requested: list[str] | None = requested_fixes()
    except FixError:  # an unknown name stopped this process's start-up already; say nothing rather than guess
        requested = None
    ranks = _ranks(wrapper) if wrapper is not None else {}
    return RankStatus(
        pid=os.getpid(),
        hostname=socket.gethostname(),
        fixes_requested=requested,
        fixes_applied=applied_fixes(),
        **ranks,
    ).model_dump()


def _own(obj: Any, name: str) -> Any:
    """An attribute without `WorkerWrapperBase.__getattr__`, which forwards to `self.worker` and recurses
    while the worker is not made yet."""
    try:
        return object.__getattribute__(obj, name)
    except AttributeError:
        return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ranks(wrapper: Any) -> dict[str, int | None]:
    """vLLM 0.32's multiproc executor makes each worker `WorkerWrapperBase(rpc_rank=local_rank,
    global_rank=rank)`; the worker holds `local_rank` and the parallel config (`node_rank`); the tensor and
    pipeline parallel groups are vLLM's `parallel_state`."""
    worker = _own(wrapper, "worker")
    config = _own(wrapper, "vllm_config")
    parallel = getattr(config, "parallel_config", None)
    rpc_rank = _int(_own(wrapper, "rpc_rank"))
    global_rank = _int(_own(wrapper, "global_rank"))
    local_rank = _int(getattr(worker, "local_rank", None)) if worker is not None else None
    return {
        "rank": rpc_rank if global_rank is None else global_rank,
        "local_rank": rpc_rank if local_rank is None else local_rank,
        "tp_rank": _group_rank("get_tp_group"),
        "pp_rank": _group_rank("get_pp_group"),
        "node_rank": _int(getattr(parallel, "node_rank", None)),
    }


def _group_rank(getter: str) -> int | None:
    """This process's rank in one of vLLM's parallel groups, when vLLM's distributed state is loaded here
    (never imported: a process without it has no such group)."""
    state = sys.modules.get("vllm.distributed.parallel_state")
    find = getattr(state, getter, None)
    if find is None:
        return None
    try:
        return _int(find().rank_in_group)
    except Exception:  # not initialised in this process (vLLM asserts)
        return None
