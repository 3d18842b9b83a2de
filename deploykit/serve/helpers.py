"""The pure pieces the stages share (serve/stages.py): the launch executable, secrets and their redaction,
timings, exit codes and the verdict line (the argv is read and changed by deploykit.argv). Nothing heavy
(rich, SQLAlchemy, vLLM) at import, nothing that fails."""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit import exit_codes
from deploykit.net import redact_text
from deploykit.profile.schema import SECRET_NAME

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.results.record import ResultRecord

REDACTED = "***"
_HF_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_MIN_SECRET_LEN = 6


# --- pure helpers -----------------------------------------------------------------------------------


def resolve_executable(argv: Sequence[str]) -> list[str]:
    """`vllm` → the one next to this Python (the venv deploykit runs in), when it is there."""
    result = list(argv)
    if result and result[0] == "vllm":
        beside = Path(sys.executable).parent / "vllm"
        if beside.exists():
            result[0] = str(beside)
    return result


def secret_values(plan: Plan | None, parent: Mapping[str, str]) -> list[str]:
    """Every value that must never be printed or stored: referenced secrets and secret-named variables
    (an inherited HF_TOKEN, say, that no profile declares)."""
    values = {parent[source] for source in (plan.secret_env.values() if plan else []) if parent.get(source)}
    values.update(value for name, value in parent.items() if SECRET_NAME.search(name) and value)
    return sorted((v for v in values if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def redact(text: str, secrets: Sequence[str]) -> str:
    """The one redactor (`net.redact_text`: URLs, header values, the secrets raw or as a repr shows them),
    plus anything shaped like a Hugging Face token."""
    return _HF_TOKEN_SHAPE.sub(REDACTED, redact_text(text, secrets))


def plan_for_store(plan: Plan, argv: Sequence[str]) -> dict[str, Any]:
    """The plan as stored: the launched argv, env with secrets as references, fixes, warnings."""
    data = plan.model_dump(mode="json", exclude={"facts"})
    data["argv"] = list(argv)
    return data


def overhead(timings: Mapping[str, float | None]) -> float:
    """deploykit's own time: the total minus vLLM's start-up and stop, the model build and the requests."""
    spent_elsewhere = sum(
        timings.get(key) or 0.0 for key in ("model_build_s", "startup_s", "requests_s", "stop_s")
    )
    return max(0.0, (timings.get("total_s") or 0.0) - spent_elsewhere)


def exit_code_for(record: ResultRecord) -> int:
    if record.verdict == "interrupted":
        signum = int(record.timings.get("signal") or signal.SIGTERM)
        return exit_codes.for_signal(signum)
    return exit_codes.OK if record.passed else exit_codes.FAILED


# --- what every command that stores a row prints ---------------------------------------------------


def profile_issues(exc: Exception) -> str:
    return "; ".join(str(issue) for issue in getattr(exc, "issues", [])) or str(exc)
