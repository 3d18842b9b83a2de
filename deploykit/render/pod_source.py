"""The pod's copy of a deploykit module: its comments and its docstrings left out, every statement on the
line where it was.

The chart carries deploykit in a ConfigMap and in Helm's release record, both capped at 1 MiB
(`plugin_wheel.MAX_WHEEL_BYTES`), and the wheel is stored uncompressed so that every machine renders the same
bytes. Comments and docstrings (the module's, and each class's and function's) are about a quarter of those
bytes and nothing in the pod reads them, so they stay in the checkout. Lines are blanked, never removed: a
traceback from the pod names the same line numbers as the source of the same version. A module that reads
its own `__doc__` (an argparse description) keeps its docstrings, and so does one that imports typer (its
commands' docstrings are their `--help`); a line whose docstring shares it with code is left whole, and so is
a docstring that is its function's whole body.
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
    """`source` without comments and docstrings, line for line; code unchanged."""
    text = source.decode("utf-8")
    lines = text.splitlines(keepends=True)
    line_starts = [0]
    for line in lines:
        line_starts.append(line_starts[-1] + len(line))
    docstring: tuple[int, int] | None = None
    code_seen = "__doc__" in text  # a module that reads its own docstring keeps it
    previous_end = 0
    strings: list[tuple[int, int, str]] = []  # (start, end, prefix) of every string literal
    comments: list[int] = []  # where each comment starts
    for lexeme in _LEXEME.finditer(text):
        start = lexeme.start()
        if lexeme.lastgroup == "comment":
            comments.append(start)
        else:
            strings.append((start, lexeme.end(), lexeme.group("prefix")))
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
    blanked = [docstring] if docstring is not None else []
    if "__doc__" not in text and not _TYPER.search(text):
        blanked += _body_docstring_rows(text, lines, line_starts, strings, comments)
    for first, last in blanked:
        for row in range(first, last + 1):
            line = lines[row]
            lines[row] = line[len(line.rstrip("\r\n")) :]
    return "".join(lines).encode("utf-8")


_TYPER = re.compile(r"^\s*(?:import typer|from typer\b)", re.MULTILINE)


_HEADER = re.compile(r"^[ \t]*(?:async[ \t]+)?(?:def|class)\b", re.MULTILINE)
_OPEN, _CLOSE = frozenset("([{"), frozenset(")]}")
_HEADER_MARK = re.compile(r"[()\[\]{}:#]")


def _body_docstring_rows(
    text: str,
    lines: list[str],
    line_starts: list[int],
    strings: list[tuple[int, int, str]],
    comments: list[int],
) -> list[tuple[int, int]]:
    """The rows of each class's and function's docstring: the first statement after a `def`/`class` header
    is a plain string on lines of its own, and more of the body follows it (a body of one docstring would be
    empty without it). Found from the lexemes already read (no parse: a parse of the package costs ten times
    the rest of the copy)."""
    string_starts = [start for start, _, _ in strings]
    comment_set = set(comments)

    def string_at(offset: int) -> tuple[int, int, str] | None:
        k = bisect.bisect_right(string_starts, offset) - 1
        return strings[k] if k >= 0 and strings[k][0] <= offset < strings[k][1] else None

    def code_start(row: int) -> int | None:
        """Where a row's code starts: None for a blank row, a comment-only row, or one inside a string."""
        line = lines[row]
        offset = line_starts[row] + len(line) - len(line.lstrip(" \t"))
        if not line.strip() or offset in comment_set or string_at(line_starts[row]) is not None:
            return None
        return offset

    def rest_is_empty(offset: int, row: int) -> bool:
        rest = text[offset : line_starts[row + 1]].strip()
        return not rest or rest.startswith("#")

    found = []
    for header in _HEADER.finditer(text):
        if string_at(header.end() - 1) is not None or string_at(header.start()) is not None:
            continue
        depth, at, colon = 0, header.end(), -1
        while (mark := _HEADER_MARK.search(text, at)) is not None:
            at = mark.end()
            inside = string_at(mark.start())
            if inside is not None:
                at = inside[1]
            elif mark.group() == "#":
                at = text.find("\n", at) + 1 or len(text)
            elif mark.group() in _OPEN:
                depth += 1
            elif mark.group() in _CLOSE:
                depth -= 1
            elif depth == 0:
                colon = mark.start()
                break
        if colon < 0:
            continue
        row = bisect.bisect_right(line_starts, colon) - 1
        if not rest_is_empty(colon + 1, row):
            continue  # `def f(): return 1`
        first = next((r for r in range(row + 1, len(lines)) if code_start(r) is not None), None)
        if first is None:
            continue
        start = code_start(first)
        literal = string_at(start) if start is not None else None
        if literal is None or literal[0] != start or not set(literal[2]) <= _DOCSTRING_PREFIXES:
            continue
        last = bisect.bisect_right(line_starts, literal[1] - 1) - 1
        if not rest_is_empty(literal[1], last):
            continue  # `"""Doc."""; x = 1`
        following = next((r for r in range(last + 1, len(lines)) if code_start(r) is not None), None)
        indent = start - line_starts[first]
        if following is None or (code_start(following) or 0) - line_starts[following] < indent:
            continue  # the docstring is the whole body
        found.append((first, last))
    return found


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
