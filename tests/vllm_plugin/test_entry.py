"""The vLLM plugin entry: does nothing unless asked, applies each named fix once per process."""

from __future__ import annotations

import logging
import subprocess
import sys
from types import SimpleNamespace

import pytest

from deploykit.fixes.base import FixError
from deploykit.plugin_contract import ENTRY_POINT, FIXES_ENV
from deploykit.vllm_plugin import applied, entry, status_route


@pytest.fixture(autouse=True)
def _fresh_plugin_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(applied, "_applied", {})
    # The status route's hooks patch vLLM; test_status_route.py covers them against a fake vLLM.
    monkeypatch.setattr(status_route, "install", lambda version: None)


def _counting_fix(calls: list[str], name: str) -> SimpleNamespace:
    def apply() -> str:
        calls.append(name)
        return f"target-of-{name}"

    return SimpleNamespace(apply=apply)


def test_unset_or_empty_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(entry, "load_fix", lambda name: _counting_fix(calls, name))
    for value in (None, "", " , "):
        if value is None:
            monkeypatch.delenv(FIXES_ENV, raising=False)
        else:
            monkeypatch.setenv(FIXES_ENV, value)
        entry.register()
    assert calls == []
    assert applied.applied_fixes() == {}


def test_each_named_fix_applies_once_per_process(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    monkeypatch.setattr(entry, "load_fix", lambda name: _counting_fix(calls, name))
    monkeypatch.setenv(FIXES_ENV, "matmul_lora, fp32_projection,matmul_lora")
    with caplog.at_level(logging.INFO, logger="vllm"):
        entry.register()
        entry.register()  # vLLM may call the entry point more than once in one process
    assert calls == ["matmul_lora", "fp32_projection"]
    assert applied.applied_fixes() == {
        "matmul_lora": "target-of-matmul_lora",
        "fp32_projection": "target-of-fp32_projection",
    }
    lines = [r.getMessage() for r in caplog.records if "deploykit: applied fix" in r.getMessage()]
    assert len(lines) == 2 and "target-of-matmul_lora" in lines[0] and "vLLM" in lines[0]


def test_unknown_fix_name_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FIXES_ENV, "fp32_projection,fp16_everything")
    with pytest.raises(FixError, match=r"unknown fix.*fp16_everything.*known fixes"):
        entry.register()


def test_plugin_is_registered_as_a_vllm_entry_point() -> None:
    from importlib.metadata import entry_points

    found = [ep for ep in entry_points(group="vllm.general_plugins") if ep.name == "deploykit"]
    assert len(found) == 1
    assert found[0].value == ENTRY_POINT == "deploykit.vllm_plugin.entry:register"


def test_importing_the_plugin_is_cheap() -> None:
    """vLLM imports the entry point in every process: it must not pull in torch or vLLM by itself."""
    code = (
        "import sys, deploykit.vllm_plugin.entry\n"
        "print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
