"""The worker-side hooks on a plain torch model and a stand-in runner (no vLLM server)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from deploykit.files import WriteRefused
from deploykit.plugin_contract import TRACE_FILE_GLOB
from deploykit.trace.report import analyse, read_trace_dir
from deploykit.trace_records import HeaderLine, LogitsLine, ModuleLine, StepLine
from deploykit.vllm_plugin import trace_hooks as hooks


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


def test_the_hooks_write_exactly_the_shared_schema(tmp_path: Path) -> None:
    """Writer and reader share deploykit.trace_records: every key a worker writes is a field the report
    reads, and every field is written, for each kind of record (a NaN module included)."""
    runner = Runner()
    with torch.no_grad():
        runner.model.norm.weight.fill_(float("inf"))
    hooks.hook_runner(runner, tmp_path, rank=0)
    with torch.no_grad():
        runner.execute_model(scheduled("req-1"))
    [path] = tmp_path.glob(TRACE_FILE_GLOB)
    written = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    schema = {"header": HeaderLine, "step": StepLine, "module": ModuleLine, "logits": LogitsLine}
    assert {record["kind"] for record in written} == set(schema)
    for record in written:
        fields = {info.alias or name for name, info in schema[record["kind"]].model_fields.items()}
        assert set(record) == fields, record["kind"]
    assert any(record.get("output_index") == 0 for record in written)


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
        "from deploykit.vllm_plugin import entry; entry.register()\n"
        "print(*(m in sys.modules for m in ('deploykit.vllm_plugin.trace_hooks', 'torch', 'vllm')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split() == ["False", "False", "False"]


def test_with_the_env_var_register_patches_the_worker_load_model(tmp_path: Path) -> None:
    code = (
        "import os; os.environ['DEPLOYKIT_TRACE'] = os.environ['TRACE_DIR']\n"
        "from deploykit.vllm_plugin import entry; entry.register(); entry.register()\n"
        "from vllm.v1.worker.gpu_worker import Worker\n"
        "print(getattr(Worker.load_model, '__deploykit_trace__', False))\n"
    )
    env = {**__import__("os").environ, "TRACE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300, env=env
    )
    assert out.stdout.strip().splitlines()[-1] == "True"


def test_trace_files_are_the_owners_alone_and_never_written_through_a_link(tmp_path: Path) -> None:
    """A trace holds activations of users' prompts: its folder is 0700 and its files 0600 (issue 22)."""
    directory = tmp_path / "traces" / "run-1"
    runner = Runner()
    hooks.hook_runner(runner, directory, rank=0)
    with torch.no_grad():
        runner.execute_model(scheduled("req-1"))
    [path] = directory.glob(TRACE_FILE_GLOB)
    assert directory.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o777 == 0o600

    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("")
    path.unlink()
    path.symlink_to(elsewhere)
    with pytest.raises(WriteRefused), torch.no_grad():
        runner.execute_model(scheduled("req-2"))
    assert elsewhere.read_text() == ""
