"""Test-only vLLM scheduler that makes "these requests share one batch" a fact of scheduling.

A request whose body carries `"vllm_xargs": {"deploykit_test_batch": "GROUP:SIZE"}` is held back from the
scheduler until SIZE requests of the same GROUP have arrived; then all of them enter the waiting queue
together, so vLLM's next step prefills them in one batch and they decode side by side from the first token.
Which HTTP request the test's threads send first no longer matters. Requests without the marker (warm-up,
references) are scheduled as usual. Loaded with vLLM's own option
`vllm serve --scheduler-cls tests.e2e.batch_gate.GatedScheduler`, with the repository on the server's
PYTHONPATH; the CPU build never enables async scheduling,
so the plain Scheduler is the class this one extends.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

GATE_KEY = "deploykit_test_batch"


def gate_of(request: Any) -> tuple[str, int] | None:
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    marker = extra.get(GATE_KEY)
    if marker is None:
        return None
    group, _, size = str(marker).partition(":")
    return group, int(size)


class GatedScheduler(Scheduler):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: dict[str, list[Any]] = {}

    def add_request(self, request: Any) -> None:
        gate = gate_of(request)
        if gate is None:
            super().add_request(request)
            return
        group, size = gate
        held = self._held.setdefault(group, [])
        held.append(request)
        if len(held) < size:
            return
        for waiting in self._held.pop(group):
            super().add_request(waiting)
