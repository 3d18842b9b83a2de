"""GET /deploykit/status, server side: the engine-side RPC method, the route added through vLLM's endpoint
plugin loader, the guard that stops start-up when vLLM's shape changed, and what the route answers.
A fake vLLM stands in here (no import of the real one); tests/e2e/test_fix_status_e2e.py runs the real one."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest

from deploykit.fixes.base import FixError
from deploykit.plugin_contract import FIXES_ENV
from deploykit.vllm_plugin import applied, entry, status_route


@contextlib.contextmanager
def fake_vllm(*, loader: bool = True, forwards: bool = True) -> Iterator[SimpleNamespace]:
    """vllm.plugins (+ endpoint_plugins.interface) and vllm.v1.worker.worker_base, in 0.32's shape; in
    sys.modules only inside the `with` block (the fast tier checks that a test leaves no vLLM imported)."""
    found: list[Any] = []

    class WorkerWrapperBase:
        rpc_rank = 3

        def init_worker(self) -> None: ...

    if forwards:
        WorkerWrapperBase.__getattr__ = lambda self, name: None  # type: ignore[attr-defined]
    plugins = ModuleType("vllm.plugins")
    if loader:
        plugins.load_endpoint_plugins = lambda supported_tasks=None: list(found)  # type: ignore[attr-defined]
    interface = ModuleType("vllm.plugins.endpoint_plugins.interface")
    interface.init_endpoint_plugins_state = lambda *a: None  # type: ignore[attr-defined]
    endpoint_plugins = ModuleType("vllm.plugins.endpoint_plugins")
    endpoint_plugins.interface = interface  # type: ignore[attr-defined]
    worker_base = ModuleType("vllm.v1.worker.worker_base")
    worker_base.WorkerWrapperBase = WorkerWrapperBase  # type: ignore[attr-defined]
    vllm = ModuleType("vllm")
    vllm.plugins = plugins  # type: ignore[attr-defined]
    modules = {
        "vllm": vllm,
        "vllm.plugins": plugins,
        "vllm.plugins.endpoint_plugins": endpoint_plugins,
        "vllm.plugins.endpoint_plugins.interface": interface,
        "vllm.v1": ModuleType("vllm.v1"),
        "vllm.v1.worker": ModuleType("vllm.v1.worker"),
        "vllm.v1.worker.worker_base": worker_base,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, module in modules.items():
            patch.setitem(sys.modules, name, module)
        yield SimpleNamespace(plugins=plugins, wrapper=WorkerWrapperBase, found=found)


def test_install_adds_the_worker_method_and_the_route_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(applied, "_applied", {"device_penalties": "InputBatch.no_penalties"})
    with fake_vllm() as vllm:
        status_route.install("0.32.0")
        status_route.install("0.32.0")  # re-entrant
        record = vllm.wrapper().deploykit_status()
        endpoints = vllm.plugins.load_endpoint_plugins(("generate",))
    assert record["rank"] == 3 and record["fixes_applied"] == {"device_penalties": "InputBatch.no_penalties"}
    assert [type(e).__name__ for e in endpoints] == ["StatusEndpoint"]
    assert endpoints[0].name == "deploykit" and endpoints[0].required_tasks is None


@pytest.mark.parametrize(
    ("shape", "words"),
    [({"loader": False}, "endpoint-plugin loader"), ({"forwards": False}, "no longer forwards")],
)
def test_a_changed_vllm_stops_start_up_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, shape: dict[str, bool], words: str
) -> None:
    monkeypatch.setattr(applied, "_applied", {})
    monkeypatch.setattr(entry, "load_fix", lambda name: SimpleNamespace(apply=lambda: "target"))
    monkeypatch.setattr("deploykit.installed.installed_vllm_version", lambda: "0.99.1")
    monkeypatch.setenv(FIXES_ENV, "device_penalties")
    with fake_vllm(**shape), pytest.raises(FixError, match=rf"vLLM 0\.99\.1: .*{words}"):
        entry.register()


def test_active_means_every_engine_worker_applied_it() -> None:
    both = {"fixes_applied": {"a": "ta", "b": "tb"}}
    only_a = {"fixes_applied": {"a": "ta"}}
    assert status_route.active_fixes(["a", "b"], [both, both]) == {"a": "ta", "b": "tb"}
    assert status_route.active_fixes(["a", "b"], [both, only_a]) == {"a": "ta"}
    assert status_route.active_fixes(["a"], []) == {}  # no engine answered: nothing is known active


def test_active_also_means_every_rank_of_the_world_answered() -> None:
    rank = [{"rank": r, "fixes_applied": {"a": "ta"}} for r in range(3)]
    assert status_route.active_fixes(["a"], rank[:2], world_size=2) == {"a": "ta"}
    assert status_route.active_fixes(["a"], rank[:2], world_size=3) == {}  # rank 2 is silent
    assert (
        status_route.active_fixes(["a"], [rank[0], rank[0]], world_size=2) == {}
    )  # one rank twice is not two
    assert status_route.active_fixes(["a"], [{"fixes_applied": {"a": "ta"}}], world_size=1) == {}  # no rank


# --- each rank's record, in a worker process of a TP 2 world over two nodes -------------------------------


@contextlib.contextmanager
def parallel_state(tp_rank: int, pp_rank: int) -> Iterator[None]:
    """vLLM's `vllm.distributed.parallel_state` as a worker has it after distributed init (groups ready)."""
    state = ModuleType("vllm.distributed.parallel_state")
    state.get_tp_group = lambda: SimpleNamespace(rank_in_group=tp_rank)  # type: ignore[attr-defined]
    state.get_pp_group = lambda: SimpleNamespace(rank_in_group=pp_rank)  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, state.__name__, state)
        yield


class _Wrapper:
    """vLLM 0.32's WorkerWrapperBase as the multiproc executor makes it on node 1 of a TP 2, two-node world:
    rpc_rank is the node-local index, global_rank the rank in the world; `__getattr__` forwards to the
    worker, which does not exist before init_worker (then forwarding recurses, as vLLM's does)."""

    def __init__(self, rpc_rank: int, global_rank: int) -> None:
        self.rpc_rank, self.global_rank = rpc_rank, global_rank

    def init_worker(self, node_rank: int) -> None:
        parallel = SimpleNamespace(node_rank=node_rank, world_size=2)
        self.vllm_config = SimpleNamespace(parallel_config=parallel)
        self.worker = SimpleNamespace(local_rank=self.rpc_rank, rank=self.global_rank)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.worker, name)


def test_a_worker_answers_its_global_tensor_pipeline_and_node_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from deploykit.plugin_contract import RankStatus
    from deploykit.vllm_plugin.worker_status import process_record

    monkeypatch.setenv(FIXES_ENV, "device_penalties, matmul_lora")
    monkeypatch.setattr(applied, "_applied", {"device_penalties": "InputBatch.no_penalties"})
    wrapper = _Wrapper(rpc_rank=0, global_rank=1)
    wrapper.init_worker(node_rank=1)
    with parallel_state(tp_rank=1, pp_rank=0):
        record = process_record(wrapper)
    assert record == {
        "pid": os.getpid(),
        "rank": 1,  # the world's rank, not the executor-local rpc_rank (0 on every node)
        "local_rank": 0,
        "tp_rank": 1,
        "pp_rank": 0,
        "node_rank": 1,
        "hostname": socket.gethostname(),
        "fixes_requested": ["device_penalties", "matmul_lora"],
        "fixes_applied": {"device_penalties": "InputBatch.no_penalties"},
    }
    assert (
        RankStatus.model_validate(record).label()
        == f"rank 1 (tp 1, pp 0, node 1, host {socket.gethostname()})"
    )


def test_a_worker_not_yet_initialised_answers_what_it_knows_without_recursing() -> None:
    from deploykit.vllm_plugin.worker_status import process_record

    record = process_record(_Wrapper(rpc_rank=1, global_rank=3))  # no parallel_state loaded in this process
    assert (record["rank"], record["local_rank"], record["tp_rank"], record["node_rank"]) == (
        3,
        1,
        None,
        None,
    )


def test_the_real_worker_wrapper_gives_the_world_rank_not_the_node_local_one() -> None:
    """Against vLLM's own WorkerWrapperBase, as the multiproc executor makes node 1's worker of a TP 2 world
    over two nodes (before init_worker: its `__getattr__` would recurse on the missing worker)."""
    from vllm.v1.worker.worker_base import WorkerWrapperBase

    from deploykit.vllm_plugin.worker_status import process_record

    record = process_record(WorkerWrapperBase(rpc_rank=0, global_rank=1))
    assert (record["rank"], record["local_rank"]) == (1, 0)


def test_the_api_server_record_holds_no_rank() -> None:
    from deploykit.vllm_plugin.worker_status import process_record

    record = process_record()
    assert record["rank"] is None and record["tp_rank"] is None and record["pid"] == os.getpid()


class _Engine:
    """A fake engine client whose `collective_rpc` counts calls; `gate` (when set) holds each call until
    the test opens it, and `errors` fail the next calls in turn."""

    def __init__(self, answer: Any = None, error: Exception | None = None) -> None:
        self.answer, self.calls = answer, []
        self.errors: list[Exception] = [error] if error is not None else []
        self.gate: asyncio.Event | None = None

    async def collective_rpc(self, method: str, timeout: float | None = None) -> Any:
        self.calls.append(method)
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), 10)
        if self.errors:
            raise self.errors.pop(0)
        return self.answer


def test_the_route_reports_what_the_engine_workers_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FIXES_ENV, "device_penalties")
    monkeypatch.setattr(applied, "_applied", {"device_penalties": "api-side"})
    endpoint = status_route.StatusEndpoint()
    engine = _Engine([{"pid": 11, "rank": 0, "fixes_applied": {"device_penalties": "worker-side"}}])
    asyncio.run(endpoint.init_state(engine, SimpleNamespace(), SimpleNamespace()))
    body = asyncio.run(endpoint.status())
    assert engine.calls == [status_route.RPC_METHOD]
    assert body["fixes_requested"] == ["device_penalties"]
    assert body["fixes_active"] == {"device_penalties": "worker-side"}  # the engine's word, not the API's
    assert body["engine_error"] is None and body["deploykit_version"]
    assert set(body) >= {"deploykit_version", "vllm_version", "fixes_requested", "fixes_active"}


def _engine_of_world(size: int, answering: list[int]) -> _Engine:
    """An engine client whose config says a world of `size` (TP `size`, two nodes), and whose RPC is
    answered by the ranks `answering`, each with the fix applied."""
    engine = _Engine([{**RECORD, "pid": 10 + r, "rank": r, "tp_rank": r} for r in answering])
    parallel = SimpleNamespace(world_size=size, tensor_parallel_size=size, pipeline_parallel_size=1, nnodes=2)
    engine.vllm_config = SimpleNamespace(parallel_config=parallel)  # type: ignore[attr-defined]
    return engine


def test_the_route_gives_the_world_size_and_a_silent_rank_leaves_nothing_active() -> None:
    endpoint = status_route.StatusEndpoint()
    asyncio.run(endpoint.init_state(_engine_of_world(2, [0, 1]), None, None))
    body = asyncio.run(endpoint.status())
    world = {"size": 2, "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "nnodes": 2}
    assert body["world"] == world and body["ranks_unanswered"] == []
    assert body["fixes_active"] == {"device_penalties": "worker-side"}
    assert [r["rank"] for r in body["engine"]] == [0, 1]
    assert body["source"].endswith("answered by 2 engine worker(s) of a world of 2")

    endpoint = status_route.StatusEndpoint()
    asyncio.run(endpoint.init_state(_engine_of_world(2, [0]), None, None))
    body = asyncio.run(endpoint.status())
    assert body["world"] == world and body["ranks_unanswered"] == [1]
    assert body["fixes_active"] == {}  # an older reader, which knows only this field, fails too


def test_an_engine_that_does_not_answer_leaves_nothing_active(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FIXES_ENV, "device_penalties")
    endpoint = status_route.StatusEndpoint()
    asyncio.run(endpoint.init_state(_Engine(error=TimeoutError("rpc timed out")), None, None))
    body = asyncio.run(endpoint.status())
    assert body["fixes_active"] == {} and "TimeoutError: rpc timed out" in body["engine_error"]


# --- the route over HTTP: a real FastAPI app, driven through httpx's ASGI transport -----------------------

RECORD = {"pid": 11, "rank": 0, "fixes_applied": {"device_penalties": "worker-side"}}


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _serve(
    engine: _Engine | None, args: Any, *, ttl: float | None = None, clock: Any = None
) -> tuple[status_route.StatusEndpoint, Any]:
    """The endpoint attached to a real FastAPI app, initialised with the server's args as vLLM does."""
    from fastapi import FastAPI

    options = {"cache_ttl_s": ttl, "clock": clock}
    endpoint = status_route.StatusEndpoint(**{k: v for k, v in options.items() if v is not None})
    app = FastAPI()
    endpoint.attach_router(app)
    asyncio.run(endpoint.init_state(engine, SimpleNamespace(), args))
    return endpoint, app


async def _get(app: Any, *headers: dict[str, str]) -> list[httpx.Response]:
    """One GET per headers dict, all at once."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://vllm") as client:
        return list(await asyncio.gather(*(client.get(status_route.STATUS_PATH, headers=h) for h in headers)))


def get(app: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    (response,) = asyncio.run(_get(app, headers or {}))
    return response


@pytest.fixture(autouse=True)
def _no_key_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv(FIXES_ENV, "device_penalties")


@pytest.mark.parametrize(
    ("api_key", "env_key", "good", "bad"),
    [
        (["sk-one", "sk-two"], None, "sk-two", "sk-three"),  # --api-key a b: either key opens it
        ("sk-one", None, "sk-one", "sk-on"),  # a single string is one key, not its characters
        (None, "sk-env", "sk-env", "sk-one"),  # VLLM_API_KEY, as vLLM reads it
        (["sk-cli"], "sk-env", "sk-cli", "sk-env"),  # --api-key wins over VLLM_API_KEY, as in vLLM
    ],
)
def test_with_a_key_the_route_answers_401_like_v1_unless_the_bearer_carries_it(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    api_key: Any,
    env_key: str | None,
    good: str,
    bad: str,
) -> None:
    if env_key is not None:
        monkeypatch.setenv("VLLM_API_KEY", env_key)
    engine = _Engine([RECORD])
    _, app = _serve(engine, SimpleNamespace(api_key=api_key))
    for headers in ({}, {"Authorization": f"Bearer {bad}"}, {"Authorization": good}, {"X-Api-Key": good}):
        refused = get(app, headers)
        assert refused.status_code == 401, headers
        assert refused.json() == {"error": "Unauthorized"}  # vLLM's AuthenticationMiddleware body
    assert engine.calls == []  # a refused GET never reaches the engine
    for scheme in ("Bearer", "bearer"):
        answer = get(app, {"Authorization": f"{scheme} {good}"})
        assert answer.status_code == 200 and answer.json()["fixes_active"] == {
            "device_penalties": "worker-side"
        }
    assert good not in caplog.text and bad not in caplog.text


def test_without_a_key_the_route_stays_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "")  # set but empty: no key, as vLLM reads it
    for args in (SimpleNamespace(api_key=None), SimpleNamespace(api_key=[]), SimpleNamespace(), None):
        _, app = _serve(_Engine([RECORD]), args)
        assert get(app).status_code == 200
        assert get(app, {"Authorization": "Bearer anything"}).status_code == 200


def test_a_burst_of_gets_costs_one_rpc_and_the_cache_expires(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    engine = _Engine([RECORD])
    endpoint, app = _serve(engine, SimpleNamespace(api_key=["sk"]), clock=clock)
    auth = {"Authorization": "Bearer sk"}

    async def burst() -> list[httpx.Response]:
        engine.gate = asyncio.Event()
        arrived = 0
        ask = endpoint.engine_answer

        async def counted() -> status_route.EngineAnswer:
            nonlocal arrived
            arrived += 1
            if arrived == 20:  # every GET is waiting: only now may the one RPC answer
                assert engine.gate is not None
                engine.gate.set()
            return await ask()

        monkeypatch.setattr(endpoint, "engine_answer", counted)
        try:
            return await _get(app, *[auth] * 20)
        finally:
            monkeypatch.setattr(endpoint, "engine_answer", ask)
            engine.gate = None

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 20
    assert len(engine.calls) == 1
    assert all(r.json()["engine"] == [RECORD] for r in responses)

    clock.now += status_route.CACHE_TTL_S / 2  # within the cache time: the same answer, its age reported
    body = get(app, auth).json()
    assert len(engine.calls) == 1 and body["engine_answer_age_s"] == status_route.CACHE_TTL_S / 2

    clock.now += status_route.CACHE_TTL_S  # expired: the next GET asks again
    body = get(app, auth).json()
    assert len(engine.calls) == 2 and body["engine_answer_age_s"] == 0.0


def test_concurrent_gets_share_one_rpc_even_without_the_cache() -> None:
    engine = _Engine([RECORD])
    endpoint, _ = _serve(engine, None, ttl=0.0)

    async def burst() -> list[dict[str, Any]]:
        engine.gate = asyncio.Event()
        waiting = [asyncio.ensure_future(endpoint.status()) for _ in range(20)]
        await asyncio.sleep(0.05)
        waiting[0].cancel()  # a client that went away does not cancel the RPC the others wait for
        engine.gate.set()
        done = await asyncio.gather(*waiting, return_exceptions=True)
        assert isinstance(done[0], asyncio.CancelledError)
        return [d for d in done[1:] if isinstance(d, dict)]

    bodies = asyncio.run(burst())
    assert len(bodies) == 19 and all(b["fixes_active"] == {"device_penalties": "worker-side"} for b in bodies)
    assert len(engine.calls) == 1
    asyncio.run(endpoint.status())  # no cache: the next GET is a new RPC
    assert len(engine.calls) == 2


def test_a_failed_rpc_is_shared_by_its_waiters_but_not_cached() -> None:
    engine = _Engine([RECORD], error=TimeoutError("rpc timed out"))
    _, app = _serve(engine, None, clock=_Clock())  # the clock never moves: only a cached answer repeats
    first = asyncio.run(_get(app, *[{}] * 5))
    assert len(engine.calls) == 1
    for response in first:
        body = response.json()
        assert response.status_code == 200 and body["fixes_active"] == {}
        assert body["engine_error"] == "TimeoutError: rpc timed out" and body["engine_answer_age_s"] == 0.0
    body = get(app).json()  # the engine recovered: the very next GET sees it
    assert len(engine.calls) == 2 and body["engine_error"] is None
    assert body["fixes_active"] == {"device_penalties": "worker-side"}


def test_a_server_without_an_engine_says_so() -> None:
    _, app = _serve(None, None)
    body = get(app).json()
    assert body["engine"] == [] and body["engine_error"] == status_route.NO_ENGINE
