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

import io
import tokenize


def pod_source(source: bytes) -> bytes:
    """`source` without comments and without its module docstring, line for line; code unchanged."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for token in tokens:
        if token.type == tokenize.COMMENT:
            row, column = token.start
            line = lines[row - 1]
            ending = line[len(line.rstrip("\r\n")) :]
            lines[row - 1] = line[:column].rstrip() + ending
    docstring = None if "__doc__" in text else _docstring_lines(tokens)
    if docstring is not None:
        first, last = docstring
        for row in range(first, last + 1):
            line = lines[row - 1]
            lines[row - 1] = line[len(line.rstrip("\r\n")) :]
    return "".join(lines).encode("utf-8")


_BETWEEN_STATEMENTS = (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING)


def _docstring_lines(tokens: list[tokenize.TokenInfo]) -> tuple[int, int] | None:
    """The first and last line of the module docstring (read from the same tokens as the comments, no
    second parse), when it stands on lines of its own: its first statement is one string, at column 0, ended
    by a newline."""
    code = [token for token in tokens if token.type not in _BETWEEN_STATEMENTS]
    if len(code) < 2 or code[0].type != tokenize.STRING or code[0].start[1] != 0:
        return None
    if code[1].type != tokenize.NEWLINE or code[0].string.lstrip("rRuU")[:1] not in ("'", '"'):
        return None
    return code[0].start[0], code[0].end[0]
