"""`deploykit advisories`: the known-bad combinations deploykit knows, or which of them apply to a machine
(`--facts`) and a profile (`--profile`), and why each does or does not. Imports neither torch nor vLLM."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from deploykit.cli.options import FactsOption, FormatOption, TableOrJson

if TYPE_CHECKING:
    from rich.console import Console

    from deploykit.advisories import AdvisoryOutcome, Verdict


class KindParser:
    """`--kind`'s parser: one of the schema's kinds (deploykit.advisories.schema.ADVISORY_KINDS), read when
    a value is given, so that no other command imports the catalog to start. Anything else is a usage
    error (exit 2) listing the kinds."""

    __name__ = "KIND"  # what Typer's help shows as the metavar

    def __call__(self, value: str) -> str:
        from deploykit.advisories.schema import ADVISORY_KINDS

        if value not in ADVISORY_KINDS:
            raise typer.BadParameter(f"{value!r} is not a kind of advisory: {', '.join(ADVISORY_KINDS)}")
        return value


KindOption = Annotated[
    list[str] | None,
    typer.Option(
        "--kind",
        "-k",
        parser=KindParser(),
        help="Only the advisories of this kind: hang, corruption or performance (repeat for several).",
    ),
]


def advisories(
    advisory_id: Annotated[
        str | None,
        typer.Argument(
            metavar="[ID]", help="Show one advisory in full: symptom, threads, range, conditions, action."
        ),
    ] = None,
    facts: FactsOption = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", "-p", help="Judge against this profile's plan (a file, or a shipped/user profile)."
        ),
    ] = None,
    kind: KindOption = None,
    format: FormatOption = TableOrJson.table,
) -> None:
    """Known-bad combinations (model, GPU, dtype, feature, vLLM version) and their workarounds; with
    --facts and/or --profile, which apply and why each does or does not; --kind keeps those of a kind
    (hang, corruption, performance; repeatable). A compact table (80 columns when piped); one ID for the
    whole entry, --format json for every field."""
    kinds = list(dict.fromkeys(kind or []))
    if advisory_id is not None:
        _show_one(advisory_id, facts, profile, format, kinds)
        return
    if facts is None and profile is None:
        rows = catalog_rows()
    elif profile is not None:
        rows = profile_rows(profile, facts)
    else:
        rows = machine_rows(facts)
    if kinds:
        rows = [row for row in rows if row["kind"] in kinds]
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps(rows, indent=2))
    else:
        _print_table(rows, judged=facts is not None or profile is not None, kinds=kinds)


def catalog_rows() -> list[dict[str, Any]]:
    from deploykit.advisories import advisories as catalog

    return [advisory.model_dump(mode="json") for advisory in catalog()]


def _row(verdict: Verdict, outcome: AdvisoryOutcome | None) -> dict[str, Any]:
    from deploykit.advisories import advisories as catalog

    advisory = next(a for a in catalog() if a.id == verdict.id)
    row: dict[str, Any] = {
        "id": verdict.id,
        "title": advisory.title,
        "kind": advisory.kind,
        "status": verdict.status,
        "why": verdict.why,
        "checks": [check.model_dump(mode="json") for check in verdict.checks],
        "action": advisory.action.kind,
        "default": advisory.action.default,
        "references": [f"{r.label} {r.url}" for r in advisory.references],
    }
    if outcome is not None:
        row |= {"outcome": outcome.outcome, "change": outcome.change, "detail": outcome.detail}
    return row


def profile_rows(profile: str, facts_file: Any) -> list[dict[str, Any]]:
    """Every advisory judged on the plan `deploykit plan --profile P [--facts F]` makes (not validated)."""
    from deploykit.cli.options import gather_facts, open_profile
    from deploykit.plan import make_plan

    plan = make_plan(open_profile(profile), gather_facts(facts_file))
    outcomes = {outcome.id: outcome for outcome in plan.advisories}
    return [_row(verdict, outcomes.get(verdict.id)) for verdict in plan.verdicts]


def machine_rows(facts_file: Any) -> list[dict[str, Any]]:
    """Every advisory judged on the machine alone: conditions on the profile stay unknown."""
    from deploykit.advisories import judge_all, machine_facts
    from deploykit.cli.options import gather_facts
    from deploykit.vllm_compat import is_cpu_build

    facts = gather_facts(facts_file)
    platform = "cpu" if not facts.gpus or is_cpu_build(facts.vllm_version) else "cuda"
    deployment = machine_facts(
        facts, vllm_version=facts.vllm_version, platform=platform, gpu_count=len(facts.gpus)
    )
    return [_row(verdict, None) for verdict in judge_all(deployment)]


# Piped or redirected, the compact tables fit this width (a terminal gets its own width).
PIPED_WIDTH = 80
_STATUS_STYLE = {"applies": "bold yellow", "does_not_apply": "dim", "unknown": "cyan"}


def output_is_terminal() -> bool:
    """Whether stdout is a terminal, for the width: TTY_COMPATIBLE (0/1) where set, else the stream's own
    isatty(). Not Rich's `Console().is_terminal`, which FORCE_COLOR turns on for a pipe too (CI logs set
    it): colour may be forced, the width stays 80 (COLUMNS and the terminal behind the pipe do not count)."""
    stated = os.environ.get("TTY_COMPATIBLE", "")
    if stated in ("0", "1"):
        return stated == "1"
    try:
        return sys.stdout.isatty()
    except (AttributeError, ValueError):  # no stream, or a closed one
        return False


def _console() -> Console:
    # Not at import: `probe --format json` loads this module without rich. Strings are data, never markup.
    from deploykit.terminal import DataConsole

    width = None if output_is_terminal() else PIPED_WIDTH
    return DataConsole(width=width, highlight=False, soft_wrap=False)


def _action_words(action: dict[str, Any]) -> str:
    if action["kind"] == "fix":
        return f"fix {action['fix']}"
    env = " ".join(f"{k}={v}" for k, v in action["env"].items())
    words = " ".join(p for p in (env, " ".join(action["args"])) if p)
    return words or "warning only"


def _span(vllm: dict[str, Any]) -> str:
    return f"{vllm['affected_from'] or '…'}–{vllm['fixed_in'] or 'open'}"


# The advisory column takes the longest id up to this share of the width; a longer id folds (never cut).
_ID_SHARE = 0.45


def _id_width(rows: list[dict[str, Any]], width: int) -> int:
    longest = max((len(row["id"]) for row in rows), default=0)
    return max(len("advisory"), min(longest, int(width * _ID_SHARE)))


def _kinds_words(kinds: list[str]) -> str:
    return f" of kind {' or '.join(kinds)}" if kinds else ""


def by_kind(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows grouped by kind, in the schema's order (hangs first), each group in catalog order."""
    from deploykit.advisories.schema import ADVISORY_KINDS

    order = [*ADVISORY_KINDS, *sorted({row["kind"] for row in rows} - set(ADVISORY_KINDS))]
    groups = [(kind, [row for row in rows if row["kind"] == kind]) for kind in order]
    return [(kind, members) for kind, members in groups if members]


def _print_table(rows: list[dict[str, Any]], *, judged: bool, kinds: list[str] | None = None) -> None:
    """The compact view: one row per advisory, the columns a person scans; the rest is per id or JSON.
    Nothing is cut: a cell too long for its column wraps (an id with no break in it folds)."""
    from rich import box
    from rich.table import Table

    from deploykit.terminal import styled

    out = _console()
    if not rows:
        out.print(f"No advisories{_kinds_words(kinds or [])}. `deploykit advisories` lists them all.")
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("advisory", width=_id_width(rows, out.width), overflow="fold")
    if not judged:
        # Grouped by kind under a line naming it: a column for it would take the width the actions need.
        table.add_column("does (default)", overflow="fold")
        table.add_column("vLLM", no_wrap=True)
        groups = by_kind(rows)
        for kind, members in groups:
            table.add_row(styled(f"{kind} ({len(members)})", "bold"), "", "")
            for index, row in enumerate(members):
                action = row["action"]
                does = f"{_action_words(action)} ({action['default']})"
                table.add_row(row["id"], does, _span(row["vllm"]), end_section=index == len(members) - 1)
        out.print(table)
        counts = ", ".join(f"{len(members)} {kind}" for kind, members in groups)
        out.print(
            f"{len(rows)} advisories{_kinds_words(kinds or [])}{f' ({counts})' if len(groups) > 1 else ''}. "
            "`deploykit advisories ID`: one in full; --format json: all fields."
        )
        return
    table.add_column("status", no_wrap=True)
    table.add_column("outcome / why", overflow="fold")
    for row in rows:
        status = row["status"]
        outcome = row.get("outcome", "")
        if outcome and row.get("change"):
            outcome += f": {row['change']}"
        text = outcome if status == "applies" and outcome else row["why"]
        label = {"applies": "applies", "does_not_apply": "no", "unknown": "unknown"}[status]
        table.add_row(row["id"], styled(label, _STATUS_STYLE[status]), text)
    out.print(table)
    applies = sum(1 for row in rows if row["status"] == "applies")
    out.print(
        f"{applies} of {len(rows)}{_kinds_words(kinds or [])} apply. "
        "`deploykit advisories ID ...` for one in full."
    )


def _show_one(
    advisory_id: str, facts_file: Any, profile: str | None, format: TableOrJson, kinds: list[str]
) -> None:
    """One advisory: every field of its entry, and its verdict when --facts/--profile are given. With
    --kind, an advisory of another kind is refused as a list filtered by it would leave it out."""
    from deploykit.advisories import advisory_ids
    from deploykit.cli.options import fail

    if advisory_id not in advisory_ids():
        fail(f"no advisory has the id {advisory_id!r}: `deploykit advisories` lists them")
    entry = next(row for row in catalog_rows() if row["id"] == advisory_id)
    if kinds and entry["kind"] not in kinds:
        fail(
            f"advisory {advisory_id!r} is of kind {entry['kind']}, not {' or '.join(kinds)}: "
            "drop --kind to show it"
        )
    verdict: dict[str, Any] | None = None
    if facts_file is not None or profile is not None:
        rows = profile_rows(profile, facts_file) if profile is not None else machine_rows(facts_file)
        verdict = next(row for row in rows if row["id"] == advisory_id)
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps({**entry, **({"verdict": verdict} if verdict else {})}, indent=2))
        return
    _print_entry(entry, verdict)


def _condition_text(value: Any) -> str:
    """A condition as a person reads it: `one of a, b`, `2..2`, `VAR=1`, `on`."""
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict) and set(value) <= {"min", "max", "below"}:
        low = value.get("min")
        high = value.get("max", value.get("below"))
        upper = "" if high is None else (f" and < {high}" if "below" in value else f" and <= {high}")
        return (f">= {low}" if low is not None else "any") + upper
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _print_entry(entry: dict[str, Any], verdict: dict[str, Any] | None) -> None:
    import textwrap

    out = _console()
    width = min(out.width, 100)

    def para(label: str, text: str) -> None:
        lines = textwrap.wrap(text, width=width - 2, initial_indent="", subsequent_indent="")
        out.print(f"{label}:", highlight=False)
        for line in lines or ["-"]:
            out.print(f"  {line}", highlight=False)

    vllm = entry["vllm"]
    action = entry["action"]
    for line in textwrap.wrap(f"{entry['id']}: {entry['title']}", width=width, subsequent_indent="  "):
        out.print(line)
    out.print(f"kind: {entry['kind']}")
    para("symptom", entry["symptom"])
    out.print("references:")
    for ref in entry["references"]:
        label = f"{'' if ref['repo'] == 'vllm-project/vllm' else ref['repo']}#{ref['number']}"
        path = "pull" if ref["kind"] == "pr" else "issues"
        url = f"https://github.com/{ref['repo']}/{path}/{ref['number']}"
        if len(label) + len(url) + 3 <= width:
            out.print(f"  {label} {url}")
        else:  # the URL on a line of its own, whole, rather than broken after the label
            out.print(f"  {label}")
            out.print(f"    {url}")
        for line in textwrap.wrap(ref["note"], width=width - 4):
            out.print(f"    {line}")
    para("vLLM", f"{_span(vllm)}. {vllm['evidence']}")
    conditions = [
        f"{key} {_condition_text(value)}" for key, value in entry["when"].items() if value is not None
    ]
    groups = [
        " and ".join(f"{k} {_condition_text(v)}" for k, v in group.items() if v is not None)
        for group in entry["any_of"]
    ]
    if groups:
        conditions.append("any of: " + " | ".join(groups))
    para("when", "; ".join(conditions) or "decided by the fix's own rule")
    para(
        "action", f"{action['kind']}: {_action_words(action)} (default {action['default']}). {action['why']}"
    )
    if verdict is not None:
        para("here", f"{verdict['status']}: {verdict['why']}")
        if verdict.get("outcome"):
            para("plan", f"{verdict['outcome']}: {verdict.get('change') or verdict.get('detail') or ''}")


def register(app: typer.Typer) -> None:
    app.command()(advisories)
