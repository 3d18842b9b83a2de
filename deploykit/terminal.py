"""The Rich console people read deploykit on (the tables, the plan, `serve` and `smoke`'s lines): every
string it is given is data. It is shown through `untrusted_text.terminal_text` (each character a terminal
would act on written as its escape, line breaks kept) and never read as Rich markup, so a `[/x]` or an
escape sequence in a server's message, a row of the store or a facts file's GPU name is printed as written,
neither crashing the command nor clearing the screen. deploykit's own emphasis is a `Text` it builds from
its own words (`styled`), the one thing that bypasses the escaping.

Imports Rich: imported where a command prints for people, never by `probe --format json`."""

from __future__ import annotations

from typing import Any

from rich.console import Console, RenderableType
from rich.status import Status
from rich.text import Text

from deploykit.untrusted_text import terminal_text


class DataConsole(Console):
    """A Rich `Console` whose strings are data: no markup, no emoji codes, terminal-safe. Every string
    Rich is given (printed, a table's cell or title, a status line) becomes text through `render_str`."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**{**options, "markup": False, "emoji": False})

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(
            terminal_text(text, lines=True), **{**options, "markup": False, "emoji": False}
        )

    def status(self, status: RenderableType, **options: Any) -> Status:
        """Rich's spinner reads a string as markup: it is given the string's safe text instead."""
        return super().status(self.render_str(status) if isinstance(status, str) else status, **options)


def styled(words: str, style: str) -> Text:
    """deploykit's own words in a style (`bold`, `yellow`): never a string that came from outside."""
    return Text(words, style=style)
