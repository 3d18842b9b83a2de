"""What the trace hooks wrote, and what it means: the first module that made a non-finite value.

Pure Python (pydantic only): reads the JSON lines of a trace directory (records of the schema the hooks
write with, `deploykit.trace_records`) and produces `TraceReport`, whose JSON is `{"first": {...} | null,
"spread": [...], "suggested_fix": {...} | null, "requests": [...], "modules_hooked": N, ...}`. Which fix
targets the culprit each fix says itself (`Fix.trace_suggestion`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from deploykit.fixes import FIX_NAMES, load_fix
from deploykit.plugin_contract import TRACE_FILE_GLOB
from deploykit.trace_records import (
    HeaderLine,
    LogitsLine,
    ModuleLine,
    StepLine,
    TraceRecord,
    parse_record,
)

SPREAD_KEPT = 5

# --- the report ---------------------------------------------------------------------------------------


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, serialize_by_alias=True)


class BadPosition(_Out):
    token: int | None = Field(default=None, description="first index: the token (row) of the batch")
    channel: int | None = Field(default=None, description="last index: the channel (hidden unit)")
    index: list[int] = Field(default_factory=list)


class ModuleFinding(_Out):
    module: str = Field(description="qualified name in the model (named_modules())")
    class_name: str = Field(alias="class")
    dtype: str | None
    shape: list[int]
    rank: int
    step: int
    request: str | None = None
    nonfinite: int
    nan: int
    inf: int
    numel: int
    first_bad: BadPosition | None
    inputs_finite: bool
    input_absmax: float | None
    output_absmax: float | None = Field(description="absmax of the finite part of the output")
    dtype_max: float | None = None
    fraction_of_dtype_max: float | None = Field(
        default=None, description="FP16/BF16: output absmax / the dtype's largest value"
    )


class SuggestedFix(_Out):
    name: str
    evidence: str
    already_enabled: bool = False


class LogitsSummary(_Out):
    rows: int
    vocab: int
    nonfinite: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    constant_rows: int
    argmax: list[int]


class RequestTrace(_Out):
    id: str
    case: str | None = None
    steps: int
    tokens: int
    nonfinite_modules: int
    logits: LogitsSummary | None = None


class TraceReport(_Out):
    first: ModuleFinding | None
    spread: list[ModuleFinding]
    suggested_fix: SuggestedFix | None
    requests: list[RequestTrace]
    modules_hooked: int
    ranks: list[int] = Field(default_factory=list)
    model_class: str | None = None
    vllm: str | None = None
    fixes_enabled: list[str] = Field(default_factory=list)
    logits: LogitsSummary | None = Field(default=None, description="over every traced step")
    findings: list[str] = Field(default_factory=list)

    @property
    def nonfinite_found(self) -> bool:
        return self.first is not None or bool(self.spread)


class TraceReadError(RuntimeError):
    pass


# --- reading ------------------------------------------------------------------------------------------


def parse_lines(text_lines: Iterable[str]) -> list[TraceRecord]:
    lines: list[TraceRecord] = []
    for number, text in enumerate(text_lines, 1):
        if not text.strip():
            continue
        try:
            lines.append(parse_record(text))
        except ValueError as exc:
            raise TraceReadError(f"trace line {number} is not a trace record: {exc}") from exc
    return lines


def read_trace_dir(directory: Path) -> list[TraceRecord]:
    """Every record of every `trace-rank*.jsonl` in the directory, rank by rank."""
    files = sorted(directory.glob(TRACE_FILE_GLOB))
    lines: list[TraceRecord] = []
    for path in files:
        text = path.read_text(encoding="utf-8").splitlines()
        if text and not text[-1].endswith("}"):  # a worker stopped mid-write
            text = text[:-1]
        lines += parse_lines(text)
    return lines


# --- analysis -----------------------------------------------------------------------------------------


def _finding(line: ModuleLine, request: str | None) -> ModuleFinding:
    position = None
    if line.first_bad is not None:
        position = BadPosition(token=line.bad_token, channel=line.bad_channel, index=list(line.first_bad))
    return ModuleFinding(
        module=line.module,
        class_name=line.class_name,
        dtype=line.dtype,
        shape=line.shape,
        rank=line.rank,
        step=line.step,
        request=request,
        nonfinite=line.nonfinite,
        nan=line.nan,
        inf=line.inf,
        numel=line.numel,
        first_bad=position,
        inputs_finite=line.inputs_finite,
        input_absmax=line.input_absmax,
        output_absmax=line.output_absmax,
        dtype_max=line.dtype_max,
        fraction_of_dtype_max=line.fraction_of_dtype_max,
    )


def _summarise_logits(lines: Sequence[LogitsLine]) -> LogitsSummary | None:
    if not lines:
        return None
    finite_means = [(ln.mean, ln.rows) for ln in lines if ln.mean is not None]
    total_rows = sum(rows for _, rows in finite_means)
    mins = [ln.min for ln in lines if ln.min is not None]
    maxs = [ln.max for ln in lines if ln.max is not None]
    stds = [ln.std for ln in lines if ln.std is not None]
    return LogitsSummary(
        rows=sum(ln.rows for ln in lines),
        vocab=lines[0].vocab,
        nonfinite=sum(ln.nonfinite for ln in lines),
        min=min(mins) if mins else None,
        max=max(maxs) if maxs else None,
        mean=sum(m * r for m, r in finite_means) / total_rows if total_rows else None,
        std=max(stds) if stds else None,
        constant_rows=sum(ln.constant_rows for ln in lines),
        argmax=[i for ln in lines for i in ln.argmax][:16],
    )


def suggest_fix(
    first: ModuleLine, header: HeaderLine | None, lines: Sequence[ModuleLine]
) -> SuggestedFix | None:
    """The first shipped fix that says it targets the culprit module, with its evidence; None when none
    does. Each fix judges for itself (`Fix.trace_suggestion`): this function names none of them."""
    enabled = set(header.fixes) if header else set()
    for name in FIX_NAMES:
        evidence = load_fix(name).trace_suggestion(first, header, lines)
        if evidence:
            return SuggestedFix(name=name, evidence=evidence, already_enabled=name in enabled)
    return None


def analyse(
    lines: Sequence[TraceRecord],
    case_names: dict[str, str] | None = None,
) -> TraceReport:
    """Name the first module whose output is non-finite while its inputs were finite, and what follows.

    `case_names` maps an engine request id (or a prefix of it) to the smoke case that sent it.
    """
    headers = [ln for ln in lines if isinstance(ln, HeaderLine)]
    steps = [ln for ln in lines if isinstance(ln, StepLine)]
    modules = [ln for ln in lines if isinstance(ln, ModuleLine)]
    logits = [ln for ln in lines if isinstance(ln, LogitsLine)]
    header = min(headers, key=lambda h: h.rank) if headers else None
    ranks = sorted({ln.rank for ln in lines})

    step_request: dict[tuple[int, int], str] = {}
    request_order: list[str] = []
    for step in steps:
        if step.requests:
            step_request[(step.rank, step.step)] = step.requests[0]
        for request in step.requests:
            if request not in request_order:
                request_order.append(request)

    def case_of(request: str) -> str | None:
        for key, name in (case_names or {}).items():
            if key and key in request:
                return name
        return None

    ordered = sorted(modules, key=lambda ln: (ln.step, ln.rank, ln.order))
    first_line = next((ln for ln in ordered if not ln.output_finite and ln.inputs_finite), None)
    first = None
    spread: list[ModuleFinding] = []
    findings: list[str] = []
    if first_line is not None:
        where = step_request.get((first_line.rank, first_line.step))
        first = _finding(first_line, where)
        seen = {first_line.module}
        for ln in ordered:
            if len(spread) >= SPREAD_KEPT:
                break
            if ln.step != first_line.step or ln.rank != first_line.rank or ln.order <= first_line.order:
                continue
            if not ln.output_finite and ln.module not in seen:
                seen.add(ln.module)
                spread.append(_finding(ln, where))
    else:
        carried = next((ln for ln in ordered if not ln.output_finite), None)
        if carried is not None:
            spread = [_finding(carried, step_request.get((carried.rank, carried.step)))]
            findings.append(
                f"non-finite values entered the model from outside any module: {carried.module} already got "
                "non-finite inputs (check the request's inputs, e.g. pixel values, and the KV cache)"
            )

    suggested = suggest_fix(first_line, header, ordered) if first_line is not None else None

    requests: list[RequestTrace] = []
    for request in request_order:
        request_steps = [s for s in steps if s.requests and s.requests[0] == request]
        keys = {(s.rank, s.step) for s in request_steps}
        request_logits = [ln for ln in logits if (ln.rank, ln.step) in keys]
        requests.append(
            RequestTrace(
                id=request,
                case=case_of(request),
                steps=len({s.step for s in request_steps}),
                tokens=sum(s.num_tokens for s in request_steps if s.rank == (header.rank if header else 0)),
                nonfinite_modules=len(
                    {ln.module for ln in modules if (ln.rank, ln.step) in keys and not ln.output_finite}
                ),
                logits=_summarise_logits(request_logits),
            )
        )
    summary = _summarise_logits(logits)

    if first is not None:
        findings.insert(
            0,
            f"first non-finite output: {first.module} ({first.class_name}, {first.dtype}) "
            f"on rank {first.rank}, step {first.step}: {first.nonfinite} of {first.numel} values "
            f"(NaN {first.nan}, Inf {first.inf}) from finite inputs",
        )
        if suggested is not None and suggested.already_enabled:
            findings.append(
                f"{suggested.name} targets this module and is already enabled, yet the fault remains"
            )
    elif not findings:
        findings.append(
            f"no module produced a non-finite value ({header.modules_hooked if header else 0} modules "
            f"hooked, {len({(s.rank, s.step) for s in steps})} steps traced)"
        )
    if first is None and summary is not None:
        findings.append(_logits_finding(summary))
    if not steps:
        findings.append("no real request reached the model: nothing was traced")
    return TraceReport(
        first=first,
        spread=spread,
        suggested_fix=suggested,
        requests=requests,
        modules_hooked=header.modules_hooked if header else 0,
        ranks=ranks,
        model_class=header.model_class if header else None,
        vllm=header.vllm if header else None,
        fixes_enabled=header.fixes if header else [],
        logits=summary,
        findings=findings,
    )


def _logits_finding(summary: LogitsSummary) -> str:
    if summary.nonfinite:
        return f"the logits hold {summary.nonfinite} non-finite values though no module output did"
    if summary.rows and summary.constant_rows == summary.rows:
        value = summary.min if summary.min == summary.max else None
        every = f" (every logit is {value:g})" if value is not None else ""
        return (
            f"the logits are finite but constant in all {summary.rows} rows{every}: greedy decoding picks "
            "token 0 every step; look for an all-zero lm_head or final norm weight"
        )
    return (
        f"the logits are finite: min {summary.min:g}, max {summary.max:g}, mean {summary.mean:g}, "
        f"{summary.constant_rows} of {summary.rows} rows constant"
    )


# --- text for people ----------------------------------------------------------------------------------


def _describe(finding: ModuleFinding) -> list[str]:
    lines = [
        f"{finding.module}  ({finding.class_name}, {finding.dtype}, shape {finding.shape}, "
        f"rank {finding.rank})"
    ]
    bad = f"{finding.nonfinite} of {finding.numel} values non-finite (NaN {finding.nan}, Inf {finding.inf})"
    if finding.first_bad is not None:
        bad += f", first at token {finding.first_bad.token}, channel {finding.first_bad.channel}"
    lines.append("  " + bad)
    peak = f"  input absmax {_num(finding.input_absmax)}, finite output absmax {_num(finding.output_absmax)}"
    if finding.fraction_of_dtype_max is not None:
        peak += f" = {finding.fraction_of_dtype_max:.1%} of {finding.dtype} max {finding.dtype_max:g}"
    lines.append(peak)
    if finding.request:
        lines.append(f"  request {finding.request}, step {finding.step}")
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def render_text(report: TraceReport) -> str:
    out: list[str] = []
    if report.first is not None:
        out.append("first non-finite output (inputs finite):")
        out += ["  " + line for line in _describe(report.first)]
    else:
        out.append("first: none: no module produced a non-finite value from finite inputs")
    if report.spread:
        out.append("then non-finite in:")
        out += [f"  {f.module} ({f.class_name}): {f.nonfinite} of {f.numel}" for f in report.spread]
    if report.suggested_fix is not None:
        fix = report.suggested_fix
        state = " (already enabled)" if fix.already_enabled else ""
        out.append(f"suggested fix: {fix.name}{state}")
        out.append(f"  {fix.evidence}")
    elif report.first is not None:
        out.append("suggested fix: none of deploykit's fixes targets this module")
    if report.logits is not None:
        lg = report.logits
        out.append(
            f"logits: {lg.rows} rows x {lg.vocab}, non-finite {lg.nonfinite}, min {_num(lg.min)}, "
            f"max {_num(lg.max)}, mean {_num(lg.mean)}, constant rows {lg.constant_rows}, "
            f"argmax {lg.argmax[:8]}"
        )
    for request in report.requests:
        out.append(
            f"request {request.id}{f' ({request.case})' if request.case else ''}: {request.steps} steps, "
            f"{request.tokens} tokens, {request.nonfinite_modules} modules with non-finite output"
        )
    out.append(f"modules hooked: {report.modules_hooked}  ranks: {report.ranks}  model: {report.model_class}")
    out += [f"- {finding}" for finding in report.findings]
    return "\n".join(out)


def report_json(report: TraceReport) -> str:
    return report.model_dump_json(indent=2, by_alias=True)


def report_dict(report: TraceReport) -> dict[str, Any]:
    return report.model_dump(mode="json", by_alias=True)
