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

import ast
import io
import tokenize


def pod_source(source: bytes) -> bytes:
    """`source` without comments and without its module docstring, line for line; code unchanged."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    for row, column in _comment_starts(text):
        line = lines[row - 1]
        ending = line[len(line.rstrip("\r\n")) :]
        lines[row - 1] = line[:column].rstrip() + ending
    docstring = _docstring_lines(text)
    if docstring is not None:
        first, last = docstring
        for row in range(first, last + 1):
            line = lines[row - 1]
            lines[row - 1] = line[len(line.rstrip("\r\n")) :]
    return "".join(lines).encode("utf-8")


def _comment_starts(text: str) -> list[tuple[int, int]]:
    return [
        token.start
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type == tokenize.COMMENT
    ]


def _docstring_lines(text: str) -> tuple[int, int] | None:
    """The first and last line of the module docstring, when it stands on lines of its own and the module
    never reads `__doc__`."""
    if "__doc__" in text:
        return None
    body = ast.parse(text).body
    if not body or not isinstance(body[0], ast.Expr):
        return None
    value = body[0].value
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        return None
    node = body[0]
    first, last = node.lineno, node.end_lineno or node.lineno
    alone = node.col_offset == 0 and (len(body) == 1 or body[1].lineno > last)
    trailing = text.splitlines()[last - 1][node.end_col_offset or 0 :].strip()
    if not alone or (trailing and not trailing.startswith("#")):
        return None
    return first, last
