"""Reusable host buffers for the device penalties processor's host-to-device copies (no allocation per step,
no race with the DMA still reading a buffer)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class PinnedRing:
    """A few reusable host buffers for host-to-device copies: no allocation per step, and a buffer is
    rewritten only after the copy issued from it several uploads ago finished (its event), so filling
    it never races the DMA and, in steady state, never waits."""

    def __init__(self, device: torch.device, dtype: torch.dtype, capacity: int, pin: bool, slots: int = 4):
        self.device = device
        self.dtype = dtype
        self.pin = pin
        self.use_events = device.type == "cuda"
        self.buffers = [self._allocate(capacity) for _ in range(slots)]
        self.events: list[Any] = [None] * slots
        self.current = 0

    def _allocate(self, capacity: int) -> torch.Tensor:
        return torch.empty(max(1, capacity), dtype=self.dtype, pin_memory=self.pin)

    def upload(self, data: np.ndarray, dest: torch.Tensor) -> torch.Tensor:
        """Copy `data` (1-D) into dest[:n] on the device; returns that view."""
        n = int(data.shape[0])
        self.current = (self.current + 1) % len(self.buffers)
        slot = self.current
        event = self.events[slot]
        if event is not None:
            event.synchronize()
        if self.buffers[slot].shape[0] < n:  # only on an unusually large batch change
            self.buffers[slot] = self._allocate(int(n * 1.5))
        host = self.buffers[slot][:n]
        host.numpy()[:] = data
        view = dest[:n]
        view.copy_(host, non_blocking=self.use_events)
        if self.use_events:
            if event is None:
                event = torch.cuda.Event()  # type: ignore[no-untyped-call]
                self.events[slot] = event
            event.record()
        return view
