"""The terminal while deploykit launches vLLM (`serve`, its restarts, `smoke`, `trace`): deploykit's own
progress for people; vLLM's log stays in its file unless the person asked to see it (`--verbose`). A
server's words in these lines are data: deploykit.terminal's console escapes what a terminal would act on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deploykit.smoke import CaseResult

# Without a terminal (a pipe, a journal) the start-up line is printed, not redrawn: the first after this
# many seconds (a quick start prints none), then one a minute, so a stuck start still shows it is alive.
FIRST_PLAIN_PROGRESS_S = 10.0
PLAIN_PROGRESS_EVERY_S = 60.0
PROGRESS_LINE_CHARS = 100  # of vLLM's latest log line: its end, where the news is
TEXT_SHOWN_CHARS = 60  # of a case's answer, beside its ids


class ConsoleUI:
    """deploykit's lines on stdout; while vLLM loads, one progress line on stderr (redrawn in place on a
    terminal). vLLM's log goes to its file, whose path deploykit prints; `quiet=False` (`--verbose`)
    also streams it to stderr as it is written."""

    def __init__(self, quiet: bool = True) -> None:
        from deploykit.terminal import DataConsole

        self.out = DataConsole(highlight=False)
        self.err = DataConsole(stderr=True, highlight=False)
        self.quiet = quiet
        self._status: Any = None
        self._next_plain = FIRST_PLAIN_PROGRESS_S

    @property
    def verbose(self) -> bool:
        return not self.quiet

    # soft_wrap: deploykit's own lines are never re-flowed to 80 columns (a pipe, a file, a journal):
    # a verdict stays one line for grep and a path is never split; a terminal wraps them itself.
    def say(self, message: str) -> None:
        self.out.print(message, soft_wrap=True)
        self.out.file.flush()

    def warn(self, message: str) -> None:
        self.err.print(f"deploykit: {message}", style="yellow", soft_wrap=True)

    def log_lines(self, lines: Sequence[str]) -> None:
        """vLLM's new log lines: on stderr when verbose, else nowhere (they are in its log file)."""
        if self.verbose:
            for line in lines:
                self.err.print(line, highlight=False, soft_wrap=True)

    def progress(self, elapsed: float, last_line: str) -> None:
        """The one line while vLLM loads: seconds so far and vLLM's latest log line."""
        latest = (
            last_line if len(last_line) <= PROGRESS_LINE_CHARS else "…" + last_line[1 - PROGRESS_LINE_CHARS :]
        )
        text = f"starting vLLM: {elapsed:4.0f} s  {latest}"
        if self.err.is_terminal:
            if self._status is None:
                self._status = self.err.status(text)
                self._status.start()
            else:
                self._status.update(text)
        elif elapsed >= self._next_plain:
            self._next_plain = elapsed + PLAIN_PROGRESS_EVERY_S
            self.err.print(text, soft_wrap=True)

    def end_progress(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        self._next_plain = FIRST_PLAIN_PROGRESS_S  # a restart's start-up gets its own lines

    def case(self, result: CaseResult) -> None:
        mark = "ok  " if result.passed else "FAIL"
        speed = f"{result.tokens_per_s:.1f} tok/s" if result.tokens_per_s else "-"
        line = (
            f"  {mark} {result.name:<12} {result.latency_s:6.2f} s  {speed:>12}  ids {result.first_ids[:8]}"
        )
        if result.text:  # the model's words beside its ids, quoted (repr): a line break shows as \n
            line += f"  {result.text[:TEXT_SHOWN_CHARS]!r}"
        if result.diagnosis:  # one line, however the server's message was broken
            from deploykit.untrusted_text import terminal_text

            line += f"\n       {terminal_text(result.diagnosis)}"
        self.say(line)


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


def log_echo(
    path: Path, emit: Callable[[str], None], clean: Callable[[str], str] = str
) -> Callable[..., None]:
    """For `--verbose` where no ConsoleUI runs (`trace`): a callback, usable as a start-up progress hook,
    that passes each line the log gained since its last call through `clean` (redaction) to `emit`."""
    follower = LogFollower(path)

    def echo(*_: object) -> None:
        for line in follower.new_lines():
            emit(clean(line))

    return echo
