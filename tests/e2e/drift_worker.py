"""Test-only vLLM worker with the fault NaN checks cannot see: finite drift.

Silent data corruption on a GPU mostly gives finite, wrong numbers (only ~1 % of outcomes are NaN/Inf). This
worker reproduces that shape on the CPU build: after a trigger, every forward pass mixes each token's final
hidden state with a fixed rotation of itself (`h + DRIFT_SCALE * roll(h, 1)`). The result is finite, the same
for the same token whatever the batch, the prefix cache or the request order (so repeats, long→short, prefix
cache and batch all agree with each other), its ids are ordinary words, and yet greedy answers change.

Triggers (each worker process keeps its own state; the CPU build runs one worker):
- a request marked `"vllm_xargs": {"deploykit_test_fault": "drift"}` (the test controls when), or
- `DEPLOYKIT_TEST_DRIFT_FROM_START=1`: drifted from the first request (a faulty replica).

Loaded with `vllm serve --worker-cls tests.e2e.drift_worker.DriftWorker`, the repository on PYTHONPATH.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

FAULT_KEY = "deploykit_test_fault"
MARKER = "drift"
FROM_START_ENV = "DEPLOYKIT_TEST_DRIFT_FROM_START"
DRIFT_SCALE = 0.5
WORKER_CLS = "tests.e2e.drift_worker.DriftWorker"

logger = logging.getLogger("deploykit.test.drift")


def carries_drift_marker(scheduler_output: Any) -> bool:
    for new in getattr(scheduler_output, "scheduled_new_reqs", None) or []:
        extra = getattr(getattr(new, "sampling_params", None), "extra_args", None) or {}
        if extra.get(FAULT_KEY) == MARKER:
            return True
    return False


def drift(hidden: torch.Tensor) -> torch.Tensor:
    """Finite, deterministic per token, and enough to move greedy choices."""
    return hidden + DRIFT_SCALE * torch.roll(hidden, shifts=1, dims=-1)


class DriftWorker(CPUWorker):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drifting = os.environ.get(FROM_START_ENV, "") == "1"

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        model = self.model_runner.model
        original = model.forward
        worker = self

        def forward(*f_args: Any, **f_kwargs: Any) -> Any:
            out = original(*f_args, **f_kwargs)
            if worker.drifting and isinstance(out, torch.Tensor):
                return drift(out)
            return out

        model.forward = forward

    def execute_model(self, scheduler_output: Any) -> Any:
        # The marker takes effect from the step after the one that carried it, like the NaN fault.
        output = super().execute_model(scheduler_output)
        if not self.drifting and carries_drift_marker(scheduler_output):
            self.drifting = True
            logger.warning("deploykit test fault: every later forward pass drifts (finite, consistent)")
        return output
