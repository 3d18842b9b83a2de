"""The worker-side hooks on a plain torch model and a stand-in runner (no vLLM server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from deploykit.trace import hooks
from deploykit.trace.report import analyse, read_trace_dir


class NanOnZero(torch.nn.Module):
    """Like an embedding row that is NaN: only an all-zero input (vLLM's dummy run) reaches it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x == 0, torch.full_like(x, float("nan")), x)


class InPlaceNorm(torch.nn.Module):
    """Writes its output into its input, as vLLM's fused add+RMSNorm does."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mul_(self.weight)


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.guard = NanOnZero()
        self.proj = torch.nn.Linear(4, 4)
        self.norm = InPlaceNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(self.guard(x)))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ torch.ones(4, 6)


class Runner:
    def __init__(self) -> None:
        self.model = Tiny()

    def get_model(self) -> torch.nn.Module:
        return self.model

    def execute_model(self, scheduler_output: Any) -> torch.Tensor:
        x = torch.arange(1.0, 9.0).reshape(2, 4)
        return self.model.compute_logits(self.model(x))

    def _dummy_run(self, num_tokens: int) -> torch.Tensor:
        return self.model(torch.zeros(num_tokens, 4))

    def profile_run(self) -> None:
        self._dummy_run(8)


def scheduled(request: str) -> SimpleNamespace:
    return SimpleNamespace(num_scheduled_tokens={request: 2})


def test_dummy_runs_are_ignored_and_real_steps_recorded(tmp_path: Path) -> None:
    runner = Runner()
    hooks.hook_runner(runner, tmp_path)
    assert runner.profile_run() is None  # NaN on all-zero input: must not be recorded
    runner._dummy_run(4)
    with torch.no_grad():
        runner.execute_model(scheduled("req-1"))
    lines = read_trace_dir(tmp_path)
    report = analyse(lines)
    assert report.first is None and report.spread == []
    assert report.modules_hooked == 4  # (model), guard, proj, norm
    assert [r.id for r in report.requests] == ["req-1"]
    assert report.logits is not None and report.logits.rows == 2


def test_in_place_module_is_judged_on_its_inputs_before_the_forward(tmp_path: Path) -> None:
    runner = Runner()
    with torch.no_grad():
        runner.model.norm.weight.fill_(float("inf"))
    hooks.hook_runner(runner, tmp_path)
    with torch.no_grad():
        runner.execute_model(scheduled("req-1"))
    report = analyse(read_trace_dir(tmp_path))
    assert report.first is not None and report.first.module == "norm"
    assert report.first.inputs_finite and report.first.class_name == "InPlaceNorm"
    assert report.first.first_bad is not None and report.first.first_bad.index == [0, 0]
    assert [s.module for s in report.spread] == ["(model)"]


def test_a_runner_without_dummy_run_fails_loudly_naming_vllm(tmp_path: Path) -> None:
    runner = SimpleNamespace(model=Tiny(), execute_model=lambda *_: None)
    with pytest.raises(hooks.TraceError, match="vLLM"):
        hooks.hook_runner(runner, tmp_path)


def test_output_stats_of_a_half_overflow() -> None:
    x = torch.tensor([[1.0, 70000.0], [2.0, 3.0]]).to(torch.float16)
    stats = hooks.output_stats([x])
    assert stats["inf"] == 1 and stats["first_bad"] == [0, 1] and stats["output_absmax"] == 3.0


def test_without_the_env_var_register_neither_imports_nor_hooks_anything() -> None:
    """Serving without `trace`: the plugin's cost is unchanged (the trace module is not even imported)."""
    code = (
        "import os, sys; os.environ.pop('DEPLOYKIT_TRACE', None); os.environ.pop('DEPLOYKIT_FIXES', None)\n"
        "from deploykit import plugin; plugin.register()\n"
        "print('deploykit.trace.hooks' in sys.modules, 'torch' in sys.modules, 'vllm' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "False", "False"]


def test_with_the_env_var_register_patches_the_worker_load_model(tmp_path: Path) -> None:
    code = (
        "import os; os.environ['DEPLOYKIT_TRACE'] = os.environ['TRACE_DIR']\n"
        "from deploykit import plugin; plugin.register(); plugin.register()\n"
        "from vllm.v1.worker.gpu_worker import Worker\n"
        "print(getattr(Worker.load_model, '__deploykit_trace__', False))\n"
    )
    env = {**__import__("os").environ, "TRACE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300, env=env
    )
    assert out.stdout.strip().splitlines()[-1] == "True"
