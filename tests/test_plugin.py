"""The vLLM plugin entry: does nothing unless asked, applies each named fix once per process."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

from deploykit import plugin, plugin_status
from deploykit.fixes.base import FixError


@pytest.fixture(autouse=True)
def _fresh_plugin_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "_applied", {})
    # The status route's hooks patch vLLM; tests/test_plugin_status.py covers them against a fake vLLM.
    monkeypatch.setattr(plugin_status, "install", lambda version: None)


def _counting_fix(calls: list[str], name: str) -> SimpleNamespace:
    def apply() -> str:
        calls.append(name)
        return f"target-of-{name}"

    return SimpleNamespace(apply=apply)


def test_unset_or_empty_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(plugin, "load_fix", lambda name: _counting_fix(calls, name))
    for value in (None, "", " , "):
        if value is None:
            monkeypatch.delenv(plugin.ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(plugin.ENV_VAR, value)
        plugin.register()
    assert calls == []
    assert plugin.applied_fixes() == {}


def test_each_named_fix_applies_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(plugin, "load_fix", lambda name: _counting_fix(calls, name))
    monkeypatch.setenv(plugin.ENV_VAR, "matmul_lora, fp32_projection,matmul_lora")
    with caplog.at_level(logging.INFO, logger="vllm"):
        plugin.register()
        plugin.register()  # vLLM may call the entry point more than once in one process
    assert calls == ["matmul_lora", "fp32_projection"]
    assert plugin.applied_fixes() == {
        "matmul_lora": "target-of-matmul_lora",
        "fp32_projection": "target-of-fp32_projection",
    }
    lines = [r.getMessage() for r in caplog.records if "deploykit: applied fix" in r.getMessage()]
    assert len(lines) == 2 and "target-of-matmul_lora" in lines[0] and "vLLM" in lines[0]


def test_unknown_fix_name_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ENV_VAR, "fp32_projection,fp16_everything")
    with pytest.raises(FixError, match=r"unknown fix.*fp16_everything.*known fixes"):
        plugin.register()


def test_plugin_is_registered_as_a_vllm_entry_point() -> None:
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "deploykit"]
    assert len(found) == 1
    assert found[0].value == "deploykit.plugin:register"


def test_importing_the_plugin_is_cheap() -> None:
    """vLLM imports the entry point in every process: it must not pull in torch or vLLM by itself."""
    code = "import sys, deploykit.plugin; print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
