"""The terminal during `deploykit serve` and `deploykit smoke`: progress for people, vLLM's log followed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploykit.smoke import CaseResult


class ConsoleUI:
    """Progress for people: deploykit's lines on stdout, vLLM's log on stderr (unless quiet)."""

    def __init__(self, quiet: bool = False) -> None:
        from rich.console import Console

        self.out = Console(highlight=False)
        self.err = Console(stderr=True, highlight=False)
        self.quiet = quiet
        self._status: Any = None
        self._last_plain = 0.0

    # soft_wrap: deploykit's own lines are never re-flowed to 80 columns (a pipe, a file, a journal):
    # a verdict stays one line for grep and a path is never split; a terminal wraps them itself.
    def say(self, message: str) -> None:
        self.out.print(message, markup=False, soft_wrap=True)
        self.out.file.flush()

    def warn(self, message: str) -> None:
        self.err.print(f"deploykit: {message}", markup=False, style="yellow", soft_wrap=True)

    def log_lines(self, lines: Sequence[str]) -> None:
        if not self.quiet:
            for line in lines:
                self.err.print(line, markup=False, highlight=False, soft_wrap=True)

    def progress(self, elapsed: float, last_line: str) -> None:
        text = f"starting vLLM: {elapsed:4.0f} s  {last_line[-100:]}"
        if self.err.is_terminal:
            if self._status is None:
                self._status = self.err.status(text)
                self._status.start()
            else:
                self._status.update(text)
        elif elapsed - self._last_plain >= 10:
            self._last_plain = elapsed
            self.err.print(text, markup=False)

    def end_progress(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def case(self, result: CaseResult) -> None:
        mark = "ok  " if result.passed else "FAIL"
        speed = f"{result.tokens_per_s:.1f} tok/s" if result.tokens_per_s else "-"
        line = (
            f"  {mark} {result.name:<12} {result.latency_s:6.2f} s  {speed:>12}  ids {result.first_ids[:8]}"
        )
        self.say(line + (f"\n       {result.diagnosis}" if result.diagnosis else ""))


class LogFollower:
    """Reads the lines a log file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *complete, self.partial = data.split(b"\n")
        return [line.decode(errors="replace").rstrip("\r") for line in complete]
