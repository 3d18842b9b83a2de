"""`GET /deploykit/status` inside vLLM's API server: which fixes the processes running the model applied.

The model runs in vLLM's engine processes (the engine core, and one worker process per GPU with tensor
parallelism), not in the API server that answers HTTP. So the route asks them, over vLLM's own engine RPC:

- engine side: in every process where the plugin applies fixes, it adds one method, `deploykit_status`,
  to vLLM's `WorkerWrapperBase` (the object `collective_rpc` calls a method name on in each worker). The
  method answers that rank's record (`worker_status`): pid, global, tensor and pipeline parallel rank, node
  and host, and the fixes the plugin applied there (`applied`), with targets. Across nodes too: the
  leader's executor asks the headless nodes' workers over the same RPC.
- API server side: the plugin adds its route through vLLM's own endpoint-plugin contract
  (`vllm/plugins/endpoint_plugins/interface.py`, "pair with a `vllm.general_plugins` entry that installs
  the engine side method"); that contract is opt-in through VLLM_PLUGINS, so the plugin adds its one
  endpoint to what `vllm.plugins.load_endpoint_plugins` returns instead (only when DEPLOYKIT_FIXES names a
  fix, so installing deploykit never changes another deployment). The route calls
  `engine_client.collective_rpc("deploykit_status")`: a fix is active when every rank of the engine's world
  (its parallel config: tensor × pipeline parallel, every node) answered and reports it applied.

A fix that cannot apply still stops start-up (`entry.register` raises); the route reads state
and changes nothing on the request path. It holds no secret (fix names, targets, versions, pids, ranks, host
names), but it is guarded like vLLM's `/v1` all the same: an operator who starts vLLM with a key expects
nobody without it to reach the server's routes (vLLM's own middleware guards only `/v1`, `/v2`,
`/inference`, `/cohere`), and each read costs the engine workers an RPC. Those RPCs are shared and briefly
cached (`StatusEndpoint.engine_answer`).
Nothing heavy at import: vLLM, FastAPI and torch are imported inside functions.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deploykit.plugin_contract import STATUS_PATH, STATUS_RPC_METHOD, WorldShape, unanswered_ranks
from deploykit.vllm_plugin.applied import requested_fixes
from deploykit.vllm_plugin.worker_status import process_record

RPC_METHOD = STATUS_RPC_METHOD
RPC_TIMEOUT_S = 15.0
ENDPOINT_NAME = "deploykit"
_MARKER = "__deploykit_status__"
# How long one engine answer serves later GETs. The fixes are applied at start-up and never change while
# the server lives, so an answer two seconds old is as true as a fresh one; what the cache saves is the
# fan-out: each collective_rpc interrupts every engine worker, and pollers (smoke, monitors, dashboards)
# come in bursts. Short, so a dead or restarted engine shows within seconds.
CACHE_TTL_S = 2.0
API_KEY_ENV = "VLLM_API_KEY"
# The body vLLM's AuthenticationMiddleware answers a missing or wrong key with (HTTP 401), so a client sees
# the same refusal on this route as on /v1.
UNAUTHORIZED_BODY = {"error": "Unauthorized"}
NO_ENGINE = "this server has no engine (vLLM's render-only server)"


class StatusRouteError(RuntimeError):
    """vLLM's shape changed: the route cannot be added (the plugin turns it into a FixError)."""


def _worker_status(self: Any) -> dict[str, Any]:
    """Installed as `WorkerWrapperBase.deploykit_status`; `collective_rpc` runs it in each worker."""
    return process_record(self)


def active_fixes(
    requested: list[str], records: list[dict[str, Any]], world_size: int | None = None
) -> dict[str, str]:
    """The requested fixes every engine process reports applied: at least one must answer, and, when the
    engine's world size is known, every rank of it (a reader that only knows this field still sees a rank
    that did not answer as nothing active)."""
    if not records:
        return {}
    if world_size is not None and unanswered_ranks(world_size, (_rank_of(r) for r in records)):
        return {}
    active: dict[str, str] = {}
    for name in requested:
        targets = [(r.get("fixes_applied") or {}).get(name) for r in records]
        if all(isinstance(t, str) for t in targets):
            active[name] = str(targets[0])
    return active


def _rank_of(record: dict[str, Any]) -> int | None:
    rank = record.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def engine_world(engine_client: Any) -> WorldShape | None:
    """The engine's parallel layout from the config the API server started it with (EngineClient's
    `vllm_config`); None when there is no engine or the config has another shape."""
    parallel = getattr(getattr(engine_client, "vllm_config", None), "parallel_config", None)
    sizes = ("tensor_parallel_size", "pipeline_parallel_size", "nnodes")
    try:
        return WorldShape.model_validate(
            {"size": getattr(parallel, "world_size", None), **{n: getattr(parallel, n, None) for n in sizes}}
        )
    except ValueError:  # pydantic's ValidationError: not a vLLM config of the shape this deploykit knows
        return None


def configured_api_keys(args: Any) -> list[str]:
    """The keys vLLM enforces on `/v1` for this server: `--api-key` (a list in 0.32's parsed args; a single
    string is taken too), else the VLLM_API_KEY environment variable; empty values are no key."""
    given = getattr(args, "api_key", None)
    if isinstance(given, str):
        given = [given]
    keys = list(given or []) or [os.environ.get(API_KEY_ENV)]
    return [key for key in keys if key]


def _digest(key: str) -> bytes:
    # Compared as fixed-length digests, so neither the comparison time nor the stored value reveals a key.
    return hashlib.sha256(key.encode("utf-8")).digest()


def bearer_matches(authorization: str | None, key_digests: Sequence[bytes]) -> bool:
    """Whether an `Authorization: Bearer <key>` header carries one of the keys (scheme case-insensitive,
    as vLLM reads it); every key is compared, in constant time."""
    if not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    digest = _digest(presented)
    matched = False
    for key_digest in key_digests:
        matched |= hmac.compare_digest(digest, key_digest)
    return matched


@dataclass(frozen=True)
class EngineAnswer:
    """One collective_rpc outcome: the worker records, or why there are none; `at` is the endpoint's clock."""

    at: float
    records: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


class StatusEndpoint:
    """A `vllm.plugins.endpoint_plugins.interface.EndpointPlugin`: one read-only route.

    vLLM builds it with no arguments; tests pass a short `cache_ttl_s` or a fake `clock`.
    """

    name = ENDPOINT_NAME
    required_tasks = None

    def __init__(
        self, *, cache_ttl_s: float = CACHE_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.engine_client: Any = None
        self.cache_ttl_s = cache_ttl_s
        self.clock = clock
        self._key_digests: list[bytes] | None = None  # None until init_state read the server's args
        self._answer: EngineAnswer | None = None  # the last answer that succeeded
        self._in_flight: asyncio.Task[EngineAnswer] | None = None

    def attach_router(self, app: Any) -> None:
        from fastapi import APIRouter, Header
        from fastapi.responses import JSONResponse

        async def get_status(authorization: str | None = Header(default=None)) -> Any:
            if not self.authorized(authorization):  # before any RPC: a refused GET costs the engine nothing
                return JSONResponse(UNAUTHORIZED_BODY, status_code=401)
            return await self.status()

        router = APIRouter()
        router.add_api_route(
            STATUS_PATH, get_status, methods=["GET"], response_model=None, include_in_schema=True
        )
        app.include_router(router)

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        self.engine_client = engine_client
        # Only digests are kept: the key itself is never stored, logged or answered.
        self._key_digests = [_digest(key) for key in configured_api_keys(args)]

    def authorized(self, authorization: str | None) -> bool:
        """No key configured: anyone (as before). Else the request must carry one of the server's keys."""
        digests = self._key_digests
        if digests is None:  # not initialised (vLLM always initialises first): the environment's key, if any
            digests = [_digest(key) for key in configured_api_keys(None)]
        return not digests or bearer_matches(authorization, digests)

    async def engine_answer(self) -> EngineAnswer:
        """The engine workers' records: cached for `cache_ttl_s`, and one RPC in flight at a time.

        GETs that arrive while an RPC is in flight wait for it and share its outcome, so a burst costs one
        collective_rpc. A failure (timeout, dead engine) is shared by those waiters but not cached: the next
        GET asks again, because a client reading the route after an error wants to see the engine recover,
        and the single flight already bounds the cost of an engine that keeps failing to one RPC at a time.
        A waiter that is cancelled (client gone) does not cancel the RPC the others wait for.
        """
        cached = self._answer
        if cached is not None and self.clock() - cached.at < self.cache_ttl_s:
            return cached
        flight = self._in_flight
        if flight is None or flight.get_loop() is not asyncio.get_running_loop():
            flight = self._in_flight = asyncio.ensure_future(self._ask_engine())
        return await asyncio.shield(flight)

    async def _ask_engine(self) -> EngineAnswer:
        try:
            if self.engine_client is None:
                return EngineAnswer(self.clock(), error=NO_ENGINE)
            try:
                answer = await asyncio.wait_for(
                    self.engine_client.collective_rpc(RPC_METHOD, timeout=RPC_TIMEOUT_S), RPC_TIMEOUT_S + 5
                )
                records = [dict(item) for item in answer or []]
            except Exception as exc:  # the route reports what went wrong; it never fails the server
                return EngineAnswer(self.clock(), error=f"{type(exc).__name__}: {exc}")
            self._answer = EngineAnswer(self.clock(), records=records)
            return self._answer
        finally:
            if self._in_flight is asyncio.current_task():
                self._in_flight = None

    async def status(self) -> dict[str, Any]:
        """The route's body (authorisation is the route's, in `attach_router`)."""
        from deploykit import __version__
        from deploykit.installed import installed_vllm_version

        requested = requested_fixes()
        answer = await self.engine_answer()
        world = engine_world(self.engine_client)
        size = None if world is None else world.size
        of_world = "" if size is None else f" of a world of {size}"
        return {
            "deploykit_version": __version__,
            "vllm_version": installed_vllm_version(),
            "fixes_requested": requested,
            "fixes_active": active_fixes(requested, answer.records, size),
            "engine": answer.records,
            "engine_error": answer.error,
            "engine_answer_age_s": round(max(0.0, self.clock() - answer.at), 3),
            "world": None if world is None else world.model_dump(),
            "ranks_unanswered": (
                None
                if size is None or answer.error is not None
                else unanswered_ranks(size, (_rank_of(r) for r in answer.records))
            ),
            "api_server": process_record(),
            "source": (
                f"collective_rpc({RPC_METHOD!r}) answered by {len(answer.records)} engine worker(s){of_world}"
            ),
        }


def install(vllm_version: str) -> None:
    """Add the engine-side RPC method and the route; raise StatusRouteError naming vLLM when its shape
    changed.

    Re-entrant: vLLM loads general plugins once per process, but tests may call this again.
    """

    def changed(what: str) -> StatusRouteError:
        return StatusRouteError(
            f"deploykit's status route cannot be added to vLLM {vllm_version}: {what}; this deploykit "
            "supports the vLLM layout it was written for (0.32–0.34: vllm.plugins.load_endpoint_plugins, "
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
