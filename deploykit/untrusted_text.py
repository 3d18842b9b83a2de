"""The one test for characters no string deploykit writes into a unit, a chart, a header or a line of
output may hold: control characters (C0, DEL, C1) and the Unicode line and paragraph separators. Profiles
refuse them at load, secrets read from the environment refuse them, renderers refuse or escape them.
Standard library only: the canary, smoke and the profile loader all import it."""

from __future__ import annotations

import unicodedata

_NAMES = {"\n": "LINE FEED", "\r": "CARRIAGE RETURN", "\t": "TAB", "\0": "NUL", "\x7f": "DELETE"}


def control_character(text: str) -> str | None:
    """The first control character in `text`, named as `U+000A (LINE FEED)`; None when it holds none."""
    for char in text:
        if unicodedata.category(char) == "Cc" or char in "\u2028\u2029":
            name = _NAMES.get(char) or unicodedata.name(char, "") or "a control character"
            return f"U+{ord(char):04X} ({name})"
    return None
