"""SIGINT/SIGTERM while an attempt runs: raise `Interrupted` while armed, otherwise only remember them."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class SignalGate:
    """SIGINT/SIGTERM raise `Interrupted` while `armed`; otherwise they are only remembered."""

    armed: bool = True
    received: int | None = None
    previous: dict[int, Any] = field(default_factory=dict)

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.received is None:
            self.received = signum
        if self.armed:
            self.armed = False  # one interruption is enough: cleanup must not be interrupted again
            raise Interrupted(signum)


@contextmanager
def forwarded_signals() -> Iterator[SignalGate]:
    gate = SignalGate()
    for sig in (signal.SIGINT, signal.SIGTERM):
        gate.previous[int(sig)] = signal.signal(sig, gate.handler)
    try:
        yield gate
    finally:
        for signum, previous in gate.previous.items():
            signal.signal(signum, previous)
