"""GET /deploykit/status, server side: the engine-side RPC method, the route added through vLLM's endpoint
plugin loader, the guard that stops start-up when vLLM's shape changed, and what the route answers.
A fake vLLM stands in here (no import of the real one); tests/e2e/test_fix_status_e2e.py runs the real one."""

from __future__ import annotations

import asyncio
import contextlib
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
