"""The fix index in docs/fixes.md, generated from the fix registry (deploykit.fixes): one row per
registered fix, its name, what goes wrong (its advisory's title), what it does (SUMMARY) and its page.

    python tools/fixes_index.py           # rewrite the index in docs/fixes.md
    python tools/fixes_index.py --check   # exit 1 when the index differs from the registry

tests/fixes/test_registry.py runs the check, so a fix registered without its index row fails the tests.
"""

from __future__ import annotations

import sys
from pathlib import Path

from deploykit.fixes import FIX_NAMES, load_fix

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, when run as a script or imported
from generated_section import between_markers, rewrite_or_check

DOC = Path(__file__).resolve().parents[1] / "docs" / "fixes.md"
BEGIN = "<!-- fix index: generated from deploykit/fixes by tools/fixes_index.py; do not edit -->"
END = "<!-- end of fix index -->"


def page(name: str) -> str:
    """A fix's own page, relative to docs/: docs/fixes/NAME-WITH-DASHES.md."""
    return f"fixes/{name.replace('_', '-')}.md"


def index_table() -> str:
    rows = ["| fix | what goes wrong | what it does | page |", "|---|---|---|---|"]
    for name in FIX_NAMES:
        fix = load_fix(name)
        cells = [f"`{name}`", fix.ADVISORY["title"], fix.SUMMARY, f"[{page(name)}]({page(name)})"]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def with_index(text: str) -> str:
    """The document with the text between the markers replaced by the generated index."""
    return between_markers(text, BEGIN, END, f"\n{index_table()}\n", DOC)


def main(args: list[str]) -> int:
    drift = "the fix index differs from the registry; run python tools/fixes_index.py"
    return rewrite_or_check(DOC, with_index, drift, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
