"""docs/benchmarks.md is shared: each benchmark owns one section between its markers and rewrites only it."""

from __future__ import annotations

from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(path: Path, section: str, title: str, body: str) -> None:
    """Replace the `section` block (`<!-- section:start -->` … `:end -->`), or append it; others stay."""
    start, end = f"<!-- {section}:start -->", f"<!-- {section}:end -->"
    block = f"{start}\n## {title}\n\n{body}\n{end}"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        _, after = rest.split(end, 1)
        text = before + block + after
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
