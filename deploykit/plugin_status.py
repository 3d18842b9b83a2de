"""`GET /deploykit/status` inside vLLM's API server: which fixes the processes running the model applied.

The model runs in vLLM's engine processes (the engine core, and one worker process per GPU with tensor
parallelism), not in the API server that answers HTTP. So the route asks them, over vLLM's own engine RPC:

- engine side: in every process where the plugin applies fixes, it adds one method, `deploykit_status`,
  to vLLM's `WorkerWrapperBase` (the object `collective_rpc` calls a method name on in each worker). The
  method answers that process's pid, rank and the fixes `deploykit.plugin` applied there, with targets.
- API server side: the plugin adds its route through vLLM's own endpoint-plugin contract
  (`vllm/plugins/endpoint_plugins/interface.py`, "pair with a `vllm.general_plugins` entry that installs
  the engine side method"); that contract is opt-in through VLLM_PLUGINS, so the plugin adds its one
  endpoint to what `vllm.plugins.load_endpoint_plugins` returns instead (only when DEPLOYKIT_FIXES names a
  fix, so installing deploykit never changes another deployment). The route calls
  `engine_client.collective_rpc("deploykit_status")`: a fix is active when every worker reports it applied.

A fix that cannot apply still stops start-up (`deploykit.plugin.register` raises); the route reads state,
changes nothing on the request path, and holds no secret (fix names, targets, versions, pids).
Nothing heavy at import: vLLM, FastAPI and torch are imported inside functions.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

STATUS_PATH = "/deploykit/status"
RPC_METHOD = "deploykit_status"
RPC_TIMEOUT_S = 15.0
ENDPOINT_NAME = "deploykit"
_MARKER = "__deploykit_status__"


class StatusRouteError(RuntimeError):
    """vLLM's shape changed: the route cannot be added (the plugin turns it into a FixError)."""


def process_record(rank: int | None = None) -> dict[str, Any]:
    """This process: its pid, its rank in the executor (workers only) and the fixes applied in it."""
    from deploykit.plugin import applied_fixes

    return {"pid": os.getpid(), "rank": rank, "fixes_applied": applied_fixes()}


def _worker_status(self: Any) -> dict[str, Any]:
    """Installed as `WorkerWrapperBase.deploykit_status`; `collective_rpc` runs it in each worker."""
    return process_record(getattr(self, "rpc_rank", None))


def active_fixes(requested: list[str], records: list[dict[str, Any]]) -> dict[str, str]:
    """The requested fixes every engine process reports applied (at least one process must answer)."""
    if not records:
        return {}
    active: dict[str, str] = {}
    for name in requested:
        targets = [(r.get("fixes_applied") or {}).get(name) for r in records]
        if all(isinstance(t, str) for t in targets):
            active[name] = str(targets[0])
    return active


class StatusEndpoint:
    """A `vllm.plugins.endpoint_plugins.interface.EndpointPlugin`: one read-only route."""

    name = ENDPOINT_NAME
    required_tasks = None

    def __init__(self) -> None:
        self.engine_client: Any = None

    def attach_router(self, app: Any) -> None:
        from fastapi import APIRouter

        router = APIRouter()
        router.add_api_route(STATUS_PATH, self.status, methods=["GET"], include_in_schema=True)
        app.include_router(router)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        self.engine_client = engine_client

    async def status(self) -> dict[str, Any]:
        from deploykit import __version__
        from deploykit.installed import installed_vllm_version
        from deploykit.plugin import requested_fixes

        requested = requested_fixes()
        records: list[dict[str, Any]] = []
        engine_error: str | None = None
        if self.engine_client is None:
            engine_error = "this server has no engine (vLLM's render-only server)"
        else:
            try:
                answer = await asyncio.wait_for(
                    self.engine_client.collective_rpc(RPC_METHOD, timeout=RPC_TIMEOUT_S), RPC_TIMEOUT_S + 5
                )
                records = [dict(item) for item in answer or []]
            except Exception as exc:  # the route reports what went wrong; it never fails the server
                engine_error = f"{type(exc).__name__}: {exc}"
        return {
            "deploykit_version": __version__,
            "vllm_version": installed_vllm_version(),
            "fixes_requested": requested,
            "fixes_active": active_fixes(requested, records),
            "engine": records,
            "engine_error": engine_error,
            "api_server": process_record(),
            "source": f"collective_rpc({RPC_METHOD!r}) answered by {len(records)} engine worker(s)",
        }


def install(vllm_version: str) -> None:
    """Add the engine-side RPC method and the route; raise StatusRouteError naming vLLM when its shape
    changed.

    Re-entrant: vLLM loads general plugins once per process, but tests may call this again.
    """

    def changed(what: str) -> StatusRouteError:
        return StatusRouteError(
            f"deploykit's status route cannot be added to vLLM {vllm_version}: {what}; this deploykit "
            "supports the vLLM layout of 0.32 (vllm.plugins.load_endpoint_plugins, "
            "vllm.v1.worker.worker_base.WorkerWrapperBase)"
        )

    try:
        import vllm.plugins as vllm_plugins
        from vllm.plugins.endpoint_plugins import interface
        from vllm.v1.worker.worker_base import WorkerWrapperBase
    except ImportError as exc:
        raise changed(f"cannot import {exc.name or exc}") from exc
    loader = getattr(vllm_plugins, "load_endpoint_plugins", None)
    if not callable(loader) or not hasattr(interface, "init_endpoint_plugins_state"):
        raise changed("vllm.plugins has no endpoint-plugin loader")
    if "__getattr__" not in vars(WorkerWrapperBase) or not hasattr(WorkerWrapperBase, "init_worker"):
        raise changed("WorkerWrapperBase no longer forwards collective_rpc method names")

    existing = getattr(WorkerWrapperBase, RPC_METHOD, None)
    if existing is not None and not getattr(existing, _MARKER, False):
        raise changed(f"WorkerWrapperBase already has an attribute {RPC_METHOD!r}")
    setattr(_worker_status, _MARKER, True)
    setattr(WorkerWrapperBase, RPC_METHOD, _worker_status)

    if getattr(loader, _MARKER, False):
        return

    def load_endpoint_plugins(*args: Any, **kwargs: Any) -> list[Any]:
        plugins = list(loader(*args, **kwargs))
        if not any(getattr(p, "name", None) == ENDPOINT_NAME for p in plugins):
            plugins.append(StatusEndpoint())
        return plugins

    setattr(load_endpoint_plugins, _MARKER, True)
    vllm_plugins.load_endpoint_plugins = load_endpoint_plugins
