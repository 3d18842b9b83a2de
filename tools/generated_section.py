"""The one rule of the docs tools generate a part of (tools/fixes_index.py, tools/advisories_doc.py): the
text between two markers is made from its source, rewritten on demand, and checked by the tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from deploykit import exit_codes


def between_markers(text: str, begin: str, end: str, generated: str, where: Path) -> str:
    """The document with the text between the markers replaced; a ValueError when a marker is missing."""
    head, found_begin, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not found_begin or not found_end:
        raise ValueError(f"{where}: the generated part's markers are missing ({begin} ... {end})")
    return f"{head}{begin}{generated}{end}{tail}"


def rewrite_or_check(doc: Path, wanted: Callable[[str], str], drift: str, args: list[str]) -> int:
    """`--check`: FAILED (saying `drift`) when the document differs from what its source makes; else
    rewrite it."""
    text = doc.read_text(encoding="utf-8")
    made = wanted(text)
    if "--check" in args:
        if made != text:
            print(f"{doc}: {drift}")
            return exit_codes.FAILED
        return exit_codes.OK
    doc.write_text(made, encoding="utf-8")
    return exit_codes.OK
