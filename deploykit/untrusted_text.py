"""The one test for characters no string deploykit writes into a unit, a chart, a header or a line of
output may hold: control characters (C0, DEL, C1) and the Unicode line and paragraph separators. Profiles
refuse them at load, secrets read from the environment refuse them, renderers refuse or escape them.

Text deploykit did not write (a server's answer, a row of the store, a facts file) is shown on a terminal
through `terminal_text`: every character a terminal would act on instead of showing (those above, and the
bidirectional overrides and isolates, which reorder what follows so a line can say what it does not hold)
is written as its escape, `\x1b`, visible and never dropped; the text itself is kept as it came.
Standard library only: the canary, smoke and the profile loader all import it."""

from __future__ import annotations

import re
import unicodedata

_NAMES = {"\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\t": "TAB", "\0": "NUL", "\x7f": "DELETE"}


def control_character(text: str) -> str | None:
    """The first control character in `text`, named as `U+000A (LINE FEED)`; None when it holds none."""
    for char in text:
        if unicodedata.category(char) == "Cc" or char in "\u2028\u2029":
            name = _NAMES.get(char) or unicodedata.name(char, "") or "a control character"
            return f"U+{ord(char):04X} ({name})"
    return None


BIDI_CONTROLS = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""The bidirectional formatting characters (marks, embeddings, overrides, isolates): invisible, and they
reorder the text after them."""

_ACTED_ON = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{BIDI_CONTROLS}]")
_ACTED_ON_BUT_LINE_BREAKS = re.compile(f"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029{BIDI_CONTROLS}]")


_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def terminal_text(text: str, *, lines: bool = False) -> str:
    """`text` as a terminal may show it: each character it would act on (control characters, line and
    paragraph separators, bidirectional controls) written as its escape (`\x1b`, `\u202e`); `lines`: line
    breaks stay (a log's lines). Idempotent (a backslash is left as it is), so a line made of shown parts
    can be shown again."""
    return (_ACTED_ON_BUT_LINE_BREAKS if lines else _ACTED_ON).sub(_escape, text)


def hidden_character(text: str) -> str | None:
    """Like `control_character`, the bidirectional controls too: for names and versions, which hold none."""
    found = control_character(text)
    if found is None and (bidi := next((c for c in text if c in BIDI_CONTROLS), None)):
        found = f"U+{ord(bidi):04X} ({unicodedata.name(bidi)})"
    return found
