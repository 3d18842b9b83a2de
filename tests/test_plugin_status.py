"""GET /deploykit/status, server side: the engine-side RPC method, the route added through vLLM's endpoint
plugin loader, the guard that stops start-up when vLLM's shape changed, and what the route answers.
A fake vLLM stands in here (no import of the real one); tests/e2e/test_fix_status_e2e.py runs the real one."""

from __future__ import annotations

import asyncio
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from deploykit import plugin, plugin_status
from deploykit.fixes.base import FixError


def fake_vllm(
    monkeypatch: pytest.MonkeyPatch, *, loader: bool = True, forwards: bool = True
) -> SimpleNamespace:
    """vllm.plugins (+ endpoint_plugins.interface) and vllm.v1.worker.worker_base, in 0.32's shape."""
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
    for name, module in {
        "vllm": vllm,
        "vllm.plugins": plugins,
        "vllm.plugins.endpoint_plugins": endpoint_plugins,
        "vllm.plugins.endpoint_plugins.interface": interface,
        "vllm.v1": ModuleType("vllm.v1"),
        "vllm.v1.worker": ModuleType("vllm.v1.worker"),
        "vllm.v1.worker.worker_base": worker_base,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    return SimpleNamespace(plugins=plugins, wrapper=WorkerWrapperBase, found=found)


def test_install_adds_the_worker_method_and_the_route_once(monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = fake_vllm(monkeypatch)
    monkeypatch.setattr(plugin, "_applied", {"device_penalties": "InputBatch.no_penalties"})
    plugin_status.install("0.32.0")
    plugin_status.install("0.32.0")  # re-entrant
    record = vllm.wrapper().deploykit_status()
    assert record["rank"] == 3 and record["fixes_applied"] == {"device_penalties": "InputBatch.no_penalties"}
    endpoints = vllm.plugins.load_endpoint_plugins(("generate",))
    assert [type(e).__name__ for e in endpoints] == ["StatusEndpoint"]
    assert endpoints[0].name == "deploykit" and endpoints[0].required_tasks is None


@pytest.mark.parametrize(
    ("shape", "words"),
    [({"loader": False}, "endpoint-plugin loader"), ({"forwards": False}, "no longer forwards")],
)
def test_a_changed_vllm_stops_start_up_naming_the_version(
    monkeypatch: pytest.MonkeyPatch, shape: dict[str, bool], words: str
) -> None:
    fake_vllm(monkeypatch, **shape)
    monkeypatch.setattr(plugin, "_applied", {})
    monkeypatch.setattr(plugin, "load_fix", lambda name: SimpleNamespace(apply=lambda: "target"))
    monkeypatch.setattr("deploykit.installed.installed_vllm_version", lambda: "0.99.1")
    monkeypatch.setenv(plugin.ENV_VAR, "device_penalties")
    with pytest.raises(FixError, match=rf"vLLM 0\.99\.1: .*{words}"):
        plugin.register()


def test_active_means_every_engine_worker_applied_it() -> None:
    both = {"fixes_applied": {"a": "ta", "b": "tb"}}
    only_a = {"fixes_applied": {"a": "ta"}}
    assert plugin_status.active_fixes(["a", "b"], [both, both]) == {"a": "ta", "b": "tb"}
    assert plugin_status.active_fixes(["a", "b"], [both, only_a]) == {"a": "ta"}
    assert plugin_status.active_fixes(["a"], []) == {}  # no engine answered: nothing is known active


class _Engine:
    def __init__(self, answer: Any = None, error: Exception | None = None) -> None:
        self.answer, self.error, self.calls = answer, error, []

    async def collective_rpc(self, method: str, timeout: float | None = None) -> Any:
        self.calls.append(method)
        if self.error is not None:
            raise self.error
        return self.answer


def test_the_route_reports_what_the_engine_workers_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, "device_penalties")
    monkeypatch.setattr(plugin, "_applied", {"device_penalties": "api-side"})
    endpoint = plugin_status.StatusEndpoint()
    engine = _Engine([{"pid": 11, "rank": 0, "fixes_applied": {"device_penalties": "worker-side"}}])
    asyncio.run(endpoint.init_state(engine, SimpleNamespace(), SimpleNamespace()))
    body = asyncio.run(endpoint.status())
    assert engine.calls == [plugin_status.RPC_METHOD]
    assert body["fixes_requested"] == ["device_penalties"]
    assert body["fixes_active"] == {"device_penalties": "worker-side"}  # the engine's word, not the API's
    assert body["engine_error"] is None and body["deploykit_version"]
    assert set(body) >= {"deploykit_version", "vllm_version", "fixes_requested", "fixes_active"}


def test_an_engine_that_does_not_answer_leaves_nothing_active(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, "device_penalties")
    endpoint = plugin_status.StatusEndpoint()
    asyncio.run(endpoint.init_state(_Engine(error=TimeoutError("rpc timed out")), None, None))
    body = asyncio.run(endpoint.status())
    assert body["fixes_active"] == {} and "TimeoutError: rpc timed out" in body["engine_error"]
