"""The catalog in docs/advisories.md, generated from the advisory catalog (deploykit.advisories: each
registered fix's ADVISORY and catalog.yaml): an index, then one section per advisory, grouped by kind
(hangs first), each with its id as an anchor heading, title, kind, symptom, vLLM range and evidence, the
conditions in words, the action and the upstream threads with their URLs.

    python tools/advisories_doc.py           # rewrite the generated part of docs/advisories.md
    python tools/advisories_doc.py --check   # exit 1 when it differs from the catalog

tests/advisories/test_doc.py runs the check, so an advisory added or changed without running this fails
the tests. Only the text between the markers is generated; the rest of the page is written by hand.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from deploykit.advisories import advisories as catalog_advisories
from deploykit.advisories.schema import ADVISORY_KINDS, Action, Advisory, Conditions
from deploykit.fixes import FIX_MODULES

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, when run as a script or imported
from generated_section import between_markers, rewrite_or_check

DOC = Path(__file__).resolve().parents[1] / "docs" / "advisories.md"
BEGIN = "<!-- advisories: generated from the catalog by tools/advisories_doc.py; do not edit -->"
END = "<!-- end of advisories -->"

# Each kind's heading (what each means is in the page's hand-written part); a kind the schema gains later
# gets its own name as heading.
KIND_HEADINGS = {"hang": "Hangs", "corruption": "Corruption", "performance": "Performance"}

_CODE_SPAN = re.compile(r"(`[^`\n]+`)")
_SPECIAL = re.compile(r"([\\*<>\[\]~`])")


def md(words: str) -> str:
    """Catalog text as Markdown that shows it as written: `code spans` kept, the characters Markdown would
    read (`<pad>` as HTML, `[a, b)` as a link, `*`, `~`) escaped outside them; whitespace made one space."""
    parts = _CODE_SPAN.split(" ".join(words.split()))
    return "".join(part if index % 2 else _SPECIAL.sub(r"\\\1", part) for index, part in enumerate(parts))


def sentence(words: str) -> str:
    """Words that end a sentence: the next line joins them in the rendered list item."""
    return words if words.endswith((".", "!", "?")) else f"{words}."


def code(words: str) -> str:
    """Words as one code span (a flag, a variable), whatever backticks they hold."""
    fence = "``" if "`" in words else "`"
    pad = " " if "`" in words else ""
    return f"{fence}{pad}{words}{pad}{fence}"


def kinds_in_order(advisories: Sequence[Advisory]) -> list[str]:
    """The schema's kinds in its order (hang first), then any other kind an advisory has."""
    extra = sorted({advisory.kind for advisory in advisories} - set(ADVISORY_KINDS))
    return [*ADVISORY_KINDS, *extra]


def span(advisory: Advisory) -> str:
    low, high = advisory.vllm.affected_from, advisory.vllm.fixed_in
    return f"{low or '…'} – {high or 'open'}"


def range_words(advisory: Advisory) -> str:
    low, high = advisory.vllm.affected_from, advisory.vllm.fixed_in
    start = f"from {low}" if low else "as far back as the threads go"
    end = f"fixed in {high} (not affected from it on)" if high else "no release fixes it yet"
    return f"{start}; {end}"


def condition(name: str, value: Any) -> str:
    """One condition in words, generic over the schema's types (a list: one of; a range; a flag; the
    environment), so that a field the schema gains reads the same way."""
    field = code(name)
    if isinstance(value, list):
        values = ", ".join(code(str(v)) for v in value)
        return f"{field} is {values}" if len(value) == 1 else f"{field} is one of {values}"
    if isinstance(value, bool):
        return f"{field}: {'yes' if value else 'no'}"
    if isinstance(value, dict) and name == "env":
        return "the environment sets " + ", ".join(code(f"{k}={v}") for k, v in value.items())
    if isinstance(value, dict) and set(value) <= {"min", "max", "below"}:
        low, high, below = value.get("min"), value.get("max"), value.get("below")
        if low is not None and low == high:
            return f"{field} is {low}"
        bounds = []
        if low is not None:
            bounds.append(f"at least {low}")
        if high is not None:
            bounds.append(f"at most {high}")
        if below is not None:
            bounds.append(f"below {below}")
        return f"{field} {' and '.join(bounds) or 'any'}"
    if isinstance(value, dict):
        return f"{field} has " + ", ".join(code(f"{k}={v}") for k, v in value.items())
    if name.endswith("_below"):
        return f"{code(name.removesuffix('_below'))} below {value}"
    return f"{field} is {code(str(value))}"


def conditions_words(conditions: Conditions) -> str:
    data = conditions.model_dump(mode="json")
    return " and ".join(condition(name, data[name]) for name in conditions.fields_set())


def when_lines(advisory: Advisory) -> list[str]:
    """The trigger: every `when` condition, then the `any_of` groups (at least one must hold too)."""
    if advisory.action.kind == "fix":
        fix = advisory.action.fix or ""
        source = FIX_MODULES[fix].replace(".", "/") + ".py" if fix in FIX_MODULES else "deploykit/fixes"
        return [f"- **When:** the fix's own rule decides: `decide()` in `{source}`."]
    data = advisory.when.model_dump(mode="json")
    conditions = [condition(name, data[name]) for name in advisory.when.fields_set()]
    groups = [conditions_words(group) for group in advisory.any_of]
    if not conditions and not groups:
        return ["- **When:** always within the vLLM range (no other condition)."]
    if not conditions:
        return ["- **When:** at least one of these holds:", *(f"  - {group}" for group in groups)]
    lines = ["- **When:** all of these hold:", *(f"  - {words}" for words in conditions)]
    if groups:
        lines += ["  - and at least one of:", *(f"    - {group}" for group in groups)]
    return lines


def fix_page(fix: str) -> str:
    page = f"fixes/{fix.replace('_', '-')}.md"
    return f"[{page}]({page})" if (DOC.parent / page).is_file() else f"`fixes.{fix}`"


def action_words(action: Action) -> str:
    """What to do, as the index's cell says it: the fix, the args and env, or a warning."""
    if action.kind == "fix":
        return f"fix {code(action.fix or '')}"
    words = [code(f"{k}={v}") for k, v in action.env.items()]
    if action.args:
        words.append(code(" ".join(action.args)))
    return " ".join(words) or "warning only"


def action_lines(action: Action) -> list[str]:
    default = f"default **{action.default}**"
    if action.kind == "fix":
        head = f"fix {code(action.fix or '')} ({fix_page(action.fix or '')}), {default}"
    elif action.kind == "workaround":
        parts = []
        if action.args:
            parts.append("arguments " + code(" ".join(action.args)))
        if action.env:
            parts.append("environment " + ", ".join(code(f"{k}={v}") for k, v in action.env.items()))
        head = f"workaround: {' and '.join(parts)}, {default}"
    else:
        head = f"warning: nothing to apply, {default}"
    lines = [f"- **Action:** {head}.", f"  Why: {sentence(md(action.why))}"]
    if action.note:
        lines.append(f"  The warning carries a figure computed for the deployment ({code(action.note)}).")
    return lines


def thread_lines(advisory: Advisory) -> list[str]:
    lines = ["- **Threads:**"]
    for ref in advisory.references:
        label = f"{'PR ' if ref.kind == 'pr' else ''}{ref.label}"
        lines.append(f"  - [{label}]({ref.url}): {md(ref.note)}")
    return lines


def section(advisory: Advisory) -> str:
    heading = f"#### {code(advisory.id)}"
    if "." in advisory.id:  # GitHub's own anchor drops the dot: `advisories.md#ID` works for every id
        heading = f'#### <a id="{advisory.id}"></a>{code(advisory.id)}'
    lines = [
        heading,
        "",
        f"**{md(advisory.title)}**",
        "",
        f"- **Kind:** {advisory.kind}",
        f"- **Symptom:** {md(advisory.symptom)}",
        f"- **vLLM:** {range_words(advisory)}.",
        f"  Evidence: {sentence(md(advisory.vllm.evidence))}",
        *when_lines(advisory),
        *action_lines(advisory.action),
        *thread_lines(advisory),
    ]
    return "\n".join(lines)


def index_table(advisories: Sequence[Advisory]) -> str:
    rows = ["| advisory | kind | vLLM | action (default) |", "|---|---|---|---|"]
    for kind in kinds_in_order(advisories):
        for advisory in (a for a in advisories if a.kind == kind):
            link = f"[{code(advisory.id)}](#{advisory.id})"
            does = f"{action_words(advisory.action)} ({advisory.action.default})".replace("|", "\\|")
            rows.append(f"| {link} | {kind} | {span(advisory)} | {does} |")
    return "\n".join(rows)


def generated(advisories: Sequence[Advisory]) -> str:
    """The text between the markers: the index, then each kind's heading and its advisories' sections."""
    counts = ", ".join(
        f"{sum(1 for a in advisories if a.kind == kind)} {kind}" for kind in kinds_in_order(advisories)
    )
    parts = [f"{len(advisories)} advisories ({counts}).", index_table(advisories)]
    for kind in kinds_in_order(advisories):
        members = [a for a in advisories if a.kind == kind]
        parts.append(f"### {KIND_HEADINGS.get(kind, kind.capitalize())} ({len(members)})")
        if not members:
            parts.append("None in the catalog yet.")
        parts += [section(advisory) for advisory in members]
    return "\n\n".join(parts)


def with_pages(text: str, advisories: Sequence[Advisory] | None = None) -> str:
    """The document with the text between the markers replaced by the sections generated from
    `advisories` (default: the shipped catalog)."""
    entries = catalog_advisories() if advisories is None else advisories
    return between_markers(text, BEGIN, END, f"\n\n{generated(entries)}\n\n", DOC)


def main(args: list[str]) -> int:
    drift = "the advisories differ from the catalog; run python tools/advisories_doc.py"
    return rewrite_or_check(DOC, with_pages, drift, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
