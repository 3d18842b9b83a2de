"""Rich output for people. Machines use `--format json`, which never goes through here. Every string is
printed as data (deploykit.terminal: escaped, never markup); the labels' emphasis is `styled` words."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table
from rich.text import Text

from deploykit.terminal import DataConsole, styled

if TYPE_CHECKING:
    from deploykit.fixes.status import FixRow
    from deploykit.plan import Plan
    from deploykit.probe.facts import ProbeFacts
    from deploykit.profile.catalog import ProfileRow

# Not a terminal (a pipe, a file, CI): nothing is cut to fit 80 columns; ids, dates and paths come out whole.
UNCUT_WIDTH = 100_000


def output_console(highlight: bool = True) -> Console:
    """stdout for people: the terminal's width on a terminal, else wide enough that no cell is cut."""
    terminal = Console().is_terminal
    return DataConsole(width=None if terminal else UNCUT_WIDTH, highlight=highlight)


def is_terminal() -> bool:
    return console.is_terminal


def _cut(text: str, width: int) -> str:
    """Shortened for a terminal; whole when the output goes to a file or a pipe."""
    return text[:width] if is_terminal() else text


console = output_console()

_DECISION_STYLE = {"enabled": "bold green", "not_needed": "dim", "impossible": "bold red"}


def print_probe(facts: ProbeFacts) -> None:
    console.print(
        f"driver {facts.driver_version or '-'}  CUDA driver {facts.cuda_driver_version or '-'}  "
        f"vllm {facts.vllm_version or 'not installed'}  torch {facts.torch_version or 'not installed'}"
    )
    if not facts.gpus:
        return
    table = Table("#", "name", "CC", "arch", "BF16", "FP8", "Hopper", "memory MiB (free)", "MIG", "uuid")
    for gpu in facts.gpus:
        table.add_row(
            str(gpu.index),
            gpu.name,
            gpu.compute_capability,
            gpu.arch,
            _yes(gpu.bf16_native),
            _yes(gpu.fp8_native),
            _yes(gpu.is_hopper),
            _memory(gpu.memory_total_mib, gpu.memory_free_mib),
            gpu.mig_mode or "n/a",
            gpu.uuid or "-",
        )
    console.print(table)
    for gpu in facts.gpus:
        for error in gpu.errors:
            console.print(f"GPU {gpu.index}: {error}", style="yellow")


def _memory(total: int | None, free: int | None) -> str:
    return f"{'-' if total is None else total} ({'-' if free is None else free})"


def _yes(value: bool) -> str:
    return "yes" if value else "no"


def _label(words: str) -> Text:
    return styled(words, "bold")


def print_plan(plan: Plan) -> None:
    console.print(
        _label("profile"), f"{plan.profile.name}  id {_cut(plan.profile.id, 12)}  ({plan.profile.path})"
    )
    gpus = ", ".join(f"{g.name} (CC {g.compute_capability})" for g in plan.facts.gpus) or "none"
    console.print(
        _label("facts"),
        f"GPUs: {gpus}; vLLM target {plan.vllm_version or 'unknown'} ({plan.platform}, "
        f"{plan.model_runner} model runner); source {plan.facts.source}",
    )
    why = "; ".join(plan.requires.problems + plan.requires.notes)
    console.print(_label("requires"), f"{plan.requires.status}: {why}")
    for group in ("enabled", "not_needed", "impossible"):
        members = [f for f in plan.fixes if f.decision.value == group]
        if not members:
            continue
        console.print(styled(group.replace("_", " "), _DECISION_STYLE[group]))
        for fix in members:
            console.print(f"  {fix.name} ({fix.mode.value}): {fix.reason}")
    if plan.advisories:  # known-bad combinations that apply (`deploykit advisories`)
        console.print(_label("advisories"))
    for advisory in plan.advisories:
        refs = ", ".join(ref.split(" ", 1)[0] for ref in advisory.references)
        what = f": {advisory.change}" if advisory.change else ""
        console.print(f"  advisory {advisory.id} ({refs}): {advisory.outcome}{what}")
    console.print(_label("launch"))
    if plan.errors:
        console.print("  (not shown: the plan has errors, below)")
    else:
        console.print(plan.shell(), soft_wrap=True)
    console.print(_label("vLLM argv check"), f"{plan.validation.status}: {plan.validation.detail}")
    for warning in plan.warnings:
        console.print(styled("warning:", "yellow"), warning)


def print_profile_rows(rows: list[ProfileRow]) -> None:
    table = Table("profile", "status", "fixes", "advisories", "why")
    style = {
        "compatible": "green",
        "compatible_with_warnings": "yellow",
        "incompatible": "red",
        "invalid": "bold red",
    }
    for row in rows:
        table.add_row(
            row.name,
            styled(row.status.replace("_", " "), style[row.status]),
            ", ".join(row.enabled_fixes) or "-",
            "\n".join(row.advisories) or "-",
            "\n".join(row.reasons) or "-",
        )
    console.print(table)


def print_fix_rows(rows: list[FixRow]) -> None:
    table = Table("fix", "status", "patches", "detail")
    for row in rows:
        table.add_row(row.name, row.status.value, row.patches, row.detail)
    console.print(table)
