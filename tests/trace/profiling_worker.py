"""Test-only vLLM worker: the CPU worker plus the start-up dummy run a GPU worker does.

vLLM's GPU worker runs `profile_run()` (all-zero input_ids through the model) before sizing the KV cache;
the CPU worker skips it when eager with an explicit KV cache size. This worker runs the same `_dummy_run`
first, so the trace tests can prove that start-up dummy runs never count. Loaded with vLLM's own option
`--worker-cls tests.trace.profiling_worker.ProfilingCPUWorker`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

logger = logging.getLogger("vllm.deploykit.test_worker")


class ProfilingCPUWorker(CPUWorker):  # type: ignore[misc]
    def determine_available_memory(self) -> Any:
        hidden, _ = self.model_runner._dummy_run(16, is_profile=True)
        bad = not bool(torch.isfinite(hidden).all())
        logging.getLogger("vllm").warning(
            "test worker: start-up dummy run, non-finite hidden states: %s", bad
        )
        return super().determine_available_memory()
