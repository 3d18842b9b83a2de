"""deploykit.terminal's console on a real terminal (Rich's styles on): every string it is given, whether
printed, a table's cell or title, or a status line, is shown escaped and never read as markup; the only
escape sequences that reach the terminal are Rich's own styles and cursor moves around deploykit's words."""

from __future__ import annotations

import io
import re

from rich.table import Table

from deploykit.terminal import DataConsole, styled

HOSTILE = "x\x1b[2J\x1b[32mPASS\x1b[0m[/x][bold]\u202e\x07"
SHOWN = r"x\x1b[2J\x1b[32mPASS\x1b[0m[/x][bold]\u202e\x07"
# What Rich itself writes on a terminal: SGR styles, hiding/showing the cursor, moving up and erasing a line.
RICH_OWN = re.compile(r"\x1b\[[0-9;]*m|\x1b\[\?25[lh]|\x1b\[[0-9]*[AK]|\r")


def test_strings_are_data_and_only_richs_own_styles_reach_the_terminal() -> None:
    console = DataConsole(file=io.StringIO(), force_terminal=True, width=300, highlight=False)
    table = Table("name", "status", title=HOSTILE)
    table.add_row(HOSTILE, styled("compatible", "green"))
    console.print(table)
    console.print(styled("profile", "bold"), HOSTILE, style="yellow")
    console.print(HOSTILE, markup=True)  # asked for markup: still text
    with console.status(HOSTILE):
        pass
    written = console.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[32mcompatible" in written and "\x1b[1;33mprofile" in written  # deploykit's own styles
    plain = RICH_OWN.sub("", written)
    assert "\x1b" not in plain and "\u202e" not in plain and "\x07" not in plain, plain
    assert plain.count(SHOWN) == 5, plain
