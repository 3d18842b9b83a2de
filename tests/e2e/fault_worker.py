"""Test-only vLLM worker that corrupts the model for good after one long forward pass: the field's shape.

The LoRA field report's server answered short prompts correctly, broke after one prompt of ~400+ tokens,
and from then on answered every request with NaN logits (token 0) while HTTP said 200 and `/health` said
healthy, until a restart. This worker reproduces that on the CPU build with any model:

- it counts the real tokens of each `execute_model` step (scheduled by vLLM's scheduler for real
  requests; the start-up dummy and profiling runs call the model directly and never come through here);
- after one step with more than `DEPLOYKIT_TEST_FAULT_TOKENS` real tokens (default 400; `off` disables
  the length trigger), or after a step that carried a request marked with
  `"vllm_xargs": {"deploykit_test_fault": "corrupt"}` (the trigger a test controls), every later forward
  pass returns NaN hidden states, so every logit is NaN: greedy decoding picks id 0, and logprobs are NaN;
- nothing raises: the process stays up and `/health` keeps answering 200.

The hung engine (issue 31; the shape of vLLM #37729, hours of `/health` 200 during a kernel hang): a step
that carries a request marked `"vllm_xargs": {"deploykit_test_fault": "hang"}` never returns. The engine
core's step blocks for good (no token for any request after it, no scheduler stats published), while the
API server stays up and `/health` keeps answering 200; only a restart brings the server back.

Loaded with vLLM's own option `vllm serve --worker-cls tests.e2e.fault_worker.FaultWorker`, with the
repository on the server's PYTHONPATH (vLLM's processes inherit the environment). Each worker process
keeps its own state; the CPU build runs one worker.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

FAULT_KEY = "deploykit_test_fault"
TOKENS_ENV = "DEPLOYKIT_TEST_FAULT_TOKENS"
DEFAULT_TOKENS = 400
WORKER_CLS = "tests.e2e.fault_worker.FaultWorker"

logger = logging.getLogger("deploykit.test.fault")


def threshold_from_env(value: str | None) -> int | None:
    """Real tokens in one step above which the model breaks; None: only the marker breaks it."""
    if value is None or not value.strip():
        return DEFAULT_TOKENS
    if value.strip().lower() in ("off", "none", "0"):
        return None
    return int(value)


def carries_marker(scheduler_output: Any, fault: str = "corrupt") -> bool:
    for new in getattr(scheduler_output, "scheduled_new_reqs", None) or []:
        extra = getattr(getattr(new, "sampling_params", None), "extra_args", None) or {}
        if extra.get(FAULT_KEY) == fault:
            return True
    return False


class FaultWorker(CPUWorker):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fault_threshold = threshold_from_env(os.environ.get(TOKENS_ENV))
        self.fault_broken = False
        self.fault_steps = 0

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        model = self.model_runner.model
        original = model.forward
        worker = self

        def forward(*f_args: Any, **f_kwargs: Any) -> Any:
            out = original(*f_args, **f_kwargs)
            if worker.fault_broken and isinstance(out, torch.Tensor):
                return torch.full_like(out, float("nan"))
            return out

        model.forward = forward

    def execute_model(self, scheduler_output: Any) -> Any:
        if carries_marker(scheduler_output, "hang"):
            logger.warning("deploykit test fault: this forward pass never returns (a hung engine)")
            threading.Event().wait()  # for good: only the process's end ends it
        output = super().execute_model(scheduler_output)
        real_tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        if real_tokens:
            self.fault_steps += 1
        if not self.fault_broken and (
            carries_marker(scheduler_output)
            or (self.fault_threshold is not None and real_tokens > self.fault_threshold)
        ):
            self.fault_broken = True
            logger.warning(
                "deploykit test fault: step %d had %d real tokens; every later forward returns NaN",
                self.fault_steps,
                real_tokens,
            )
        return output
