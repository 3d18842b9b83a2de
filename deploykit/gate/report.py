"""The gate's report on one screen: the verdict and why, what changed between the sides, the answers, the
speed. Everything a server or a profile wrote is shown through `terminal_text` (it may hold escapes)."""

from __future__ import annotations

from deploykit.gate.judge import describe_finding
from deploykit.gate.model import GateReport, Side
from deploykit.untrusted_text import terminal_text


def _side_line(side: Side) -> str:
    figures = side.figures
    kv = f", KV cache {figures.kv_cache_tokens:,} tokens" if figures and figures.kv_cache_tokens else ""
    start = f", start-up {figures.startup_s:.1f} s" if figures and figures.startup_s else ""
    failed = len(side.failed_cases)
    cases = (
        f"{len(side.cases) - failed}/{len(side.cases)} cases passed" if side.cases else "no cases (stored)"
    )
    return (
        f"{side.role:9} {side.source} {side.url or ''}: vLLM {side.vllm_version or '?'}, {cases}{kv}{start}"
    )


def render(report: GateReport) -> list[str]:
    lines = [
        f"gate: {report.label.upper()}  ({report.profile}, {report.elapsed_s:.0f} s)",
        f"  {report.summary}",
    ]
    lines.append("sides:")
    lines += [f"  {_side_line(side)}" for side in (report.baseline, report.candidate)]
    if report.changed:
        lines.append("changed:")
        lines += [f"  {part}: {before} → {after}" for part, (before, after) in report.changed.items()]
    lines.append("answers:")
    if report.drift is not None:
        d = report.drift
        tie = "a near tie" if d.near_tie else "not a near tie"
        lines.append(
            f"  drift at {d.case!r} position {d.position}: expected id {d.expected_id}, got "
            f"{d.got_id}; baseline gap {d.baseline_gap}, tolerance {d.tolerance:.3g} ({tie})"
        )
    elif report.fingerprint_tolerance is not None:
        clear = report.fingerprint_clear or [0, 0]
        lines.append(
            f"  fingerprint: the same within {report.fingerprint_tolerance:.3g} nats "
            f"({clear[0]} of {clear[1]} positions at a clear margin)"
        )
    failed = report.candidate.failed_cases
    lines.append(
        f"  candidate cases: {len(report.candidate.cases) - len(failed)}/{len(report.candidate.cases)} passed"
        + "".join(f"; {c.name} failed: {c.diagnosis}" for c in failed[:3])
    )
    lines.append(f"speed (slower beyond {report.slower_threshold:.0%}):")
    if not report.speed:
        lines.append("  not measured")
    for finding in report.speed:
        mark = "SLOWER" if finding.slower else ("ok" if finding.judged else "reported")
        lines.append(f"  {mark:8} {describe_finding(finding)}")
    if report.row_id is not None:
        lines.append(
            f"row #{report.row_id}"
            + (f"; adopted as baseline #{report.adopted_baseline}" if report.adopted_baseline else "")
        )
    return [terminal_text(line) for line in lines]
