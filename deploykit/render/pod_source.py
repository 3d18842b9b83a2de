"""The pod's copy of a deploykit module: its comments and its module docstring left out, every statement on
the line where it was.

The chart carries deploykit in a ConfigMap and in Helm's release record, both capped at 1 MiB
(`plugin_wheel.MAX_WHEEL_BYTES`), and the wheel is stored uncompressed so that every machine renders the same
bytes. Comments and module docstrings are about a tenth of those bytes and nothing in the pod reads them,
so they stay in the checkout. Lines are blanked, never removed: a traceback from the pod names the same line
numbers as the source of the same version. A module that reads its own `__doc__` (an argparse description)
keeps its docstring, and a line whose docstring shares it with code is left whole.
"""

from __future__ import annotations

import bisect
import re

# Python's comments and string literals, found in one pass of the regular-expression engine (C code) instead
# of Python's tokenizer (pure Python before 3.12, ~90 % of a `render helm`'s wheel build): a `#` starts a
# comment only outside a string, and a string runs to its first unescaped closing quote. A prefix (r, b, u, f
# and their pairs) changes neither: in a raw string too a backslash keeps the next quote from closing it, and
# an f-string's nested strings use the other quote (before 3.12 they must). tests/render/test_pod_source.py
# holds the result to Python's own tokenizer on every module and on the hard cases.
_LEXEME = re.compile(
    r"""
    (?P<comment>\#[^\r\n]*)
    | (?P<prefix>[rRbBuUfF]{0,2})
      (?: \"\"\"(?:\\.|[^\\])*?\"\"\"
        | '''(?:\\.|[^\\])*?'''
        | "(?:\\.|[^\\"\r\n])*"
        | '(?:\\.|[^\\'\r\n])*'
      )
    """,
    re.VERBOSE | re.DOTALL,
)
_DOCSTRING_PREFIXES = frozenset("rRuU")


def pod_source(source: bytes) -> bytes:
    """`source` without comments and without its module docstring, line for line; code unchanged."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    line_starts = [0]
    for line in lines:
        line_starts.append(line_starts[-1] + len(line))
    docstring: tuple[int, int] | None = None
    code_seen = "__doc__" in text  # a module that reads its own docstring keeps it
    previous_end = 0
    for lexeme in _LEXEME.finditer(text):
        start = lexeme.start()
        row = bisect.bisect_right(line_starts, start) - 1
        if not code_seen and text[previous_end:start].strip():
            code_seen = True
        previous_end = lexeme.end()
        if lexeme.lastgroup == "comment":
            line = lines[row]
            ending = line[len(line.rstrip("\r\n")) :]
            lines[row] = line[: start - line_starts[row]].rstrip() + ending
        elif not code_seen:
            code_seen = True
            docstring = _docstring_rows(text, lexeme, row, line_starts)
    if docstring is not None:
        first, last = docstring
        for row in range(first, last + 1):
            line = lines[row]
            lines[row] = line[len(line.rstrip("\r\n")) :]
    return "".join(lines).encode("utf-8")


def _docstring_rows(
    text: str, string: re.Match[str], row: int, line_starts: list[int]
) -> tuple[int, int] | None:
    """The first and last row of the module docstring when it stands on lines of its own: the module's first
    statement is this one string, at column 0, not a bytes or f-string, and nothing but a comment follows it
    on its last line."""
    if string.start() != line_starts[row] or not set(string.group("prefix")) <= _DOCSTRING_PREFIXES:
        return None
    last = bisect.bisect_right(line_starts, string.end() - 1) - 1
    rest = text[string.end() : line_starts[last + 1]].strip()
    if rest and not rest.startswith("#"):
        return None
    return row, last
