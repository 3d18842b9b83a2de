"""`deploykit advisories`: the known-bad combinations deploykit knows, or which of them apply to a machine
(`--facts`) and a profile (`--profile`), and why each does or does not. Imports neither torch nor vLLM."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from deploykit.cli.options import FactsOption, FormatOption, TableOrJson

if TYPE_CHECKING:
    from deploykit.advisories import AdvisoryOutcome, Verdict


def advisories(
    facts: FactsOption = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile", "-p", help="Judge against this profile's plan (a file, or a shipped/user profile)."
        ),
    ] = None,
    format: FormatOption = TableOrJson.table,
) -> None:
    """Known-bad combinations (model, GPU, dtype, feature, vLLM version) and their workarounds; with
    --facts and/or --profile, which apply and why each does or does not."""
    if facts is None and profile is None:
        rows = catalog_rows()
    elif profile is not None:
        rows = profile_rows(profile, facts)
    else:
        rows = machine_rows(facts)
    if format is TableOrJson.json:
        import json

        typer.echo(json.dumps(rows, indent=2))
    else:
        _print_table(rows, judged=facts is not None or profile is not None)


def catalog_rows() -> list[dict[str, Any]]:
    from deploykit.advisories import advisories as catalog

    return [advisory.model_dump(mode="json") for advisory in catalog()]


def _row(verdict: Verdict, outcome: AdvisoryOutcome | None) -> dict[str, Any]:
    from deploykit.advisories import advisories as catalog

    advisory = next(a for a in catalog() if a.id == verdict.id)
    row: dict[str, Any] = {
        "id": verdict.id,
        "title": advisory.title,
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


def _print_table(rows: list[dict[str, Any]], *, judged: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    from deploykit.cli.report import console

    if not judged:
        table = Table("advisory", "action", "default", "symptom", "vLLM", "references")
        for row in rows:
            action = row["action"]
            env = " ".join(f"{k}={v}" for k, v in action["env"].items())
            what = action["fix"] or " ".join(action["args"]) or ("" if env else "warning only")
            vllm = row["vllm"]
            span = f"{vllm['affected_from'] or '…'} – {vllm['fixed_in'] or 'open'}"
            refs = ", ".join(
                f"{'' if r['repo'] == 'vllm-project/vllm' else r['repo']}#{r['number']}"
                for r in row["references"]
            )
            table.add_row(
                row["id"],
                " ".join(p for p in (what, env) if p),
                action["default"],
                escape(row["symptom"]),
                span,
                refs,
            )
        console.print(table)
        return
    table = Table("advisory", "status", "outcome", "why", "references")
    style = {"applies": "bold yellow", "does_not_apply": "dim", "unknown": "cyan"}
    for row in rows:
        outcome = row.get("outcome", "")
        if outcome and row.get("change"):
            outcome += f": {row['change']}"
        table.add_row(
            row["id"],
            f"[{style[row['status']]}]{row['status'].replace('_', ' ')}[/]",
            escape(outcome) or "-",
            escape(row["why"]),
            ", ".join(ref.split(" ", 1)[0] for ref in row["references"]),
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    app.command()(advisories)
