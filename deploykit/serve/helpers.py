"""What the attempt and the remote smoke share: launch argv and env, secrets and redaction, timings, exit
codes, storing the one row and printing the verdict. Nothing heavy (rich, SQLAlchemy, vLLM) at import."""

from __future__ import annotations

import re
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deploykit.profile.schema import SECRET_NAME

if TYPE_CHECKING:
    from deploykit.plan import Plan
    from deploykit.serve.console import ConsoleUI
    from deploykit.store import ResultRecord, Store

EXIT_PASS = 0
EXIT_FAIL = 1
REDACTED = "***"
_HF_TOKEN_SHAPE = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
_MIN_SECRET_LEN = 6


class ServeFailure(Exception):
    """An attempt ended before a verdict; `stage` says where."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage


# --- pure helpers -----------------------------------------------------------------------------------


def with_port(argv: Sequence[str], port: int) -> list[str]:
    """The argv with its `--port` value replaced (or added)."""
    result = list(argv)
    if "--port" in result:
        result[result.index("--port") + 1] = str(port)
    else:
        result += ["--port", str(port)]
    return result


def argv_value(argv: Sequence[str], flag: str, default: str) -> str:
    return argv[argv.index(flag) + 1] if flag in argv and argv.index(flag) + 1 < len(argv) else default


def resolve_executable(argv: Sequence[str]) -> list[str]:
    """`vllm` → the one next to this Python (the venv deploykit runs in), when it is there."""
    result = list(argv)
    if result and result[0] == "vllm":
        beside = Path(sys.executable).parent / "vllm"
        if beside.exists():
            result[0] = str(beside)
    return result


def child_environment(plan: Plan, parent: Mapping[str, str]) -> dict[str, str]:
    """The launch env: the parent's, the plan's values, and each `${NAME}` reference resolved.

    Raises ServeFailure("secrets") naming every missing variable.
    """
    env = dict(parent)
    env.pop("DEPLOYKIT_FIXES", None)  # only the plan decides which fixes run
    missing = [f"{key} (from ${source})" for key, source in plan.secret_env.items() if not parent.get(source)]
    if missing:
        raise ServeFailure(
            "secrets",
            f"the profile takes these from the environment, but they are not set: {', '.join(missing)}",
        )
    for key, value in plan.env.items():
        source = plan.secret_env.get(key)
        env[key] = parent[source] if source is not None else value
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def secret_values(plan: Plan | None, parent: Mapping[str, str]) -> list[str]:
    """Every value that must never be printed or stored: referenced secrets and secret-named variables
    (an inherited HF_TOKEN, say, that no profile declares)."""
    values = {parent[source] for source in (plan.secret_env.values() if plan else []) if parent.get(source)}
    values.update(value for name, value in parent.items() if SECRET_NAME.search(name) and value)
    return sorted((v for v in values if len(v) >= _MIN_SECRET_LEN), key=len, reverse=True)


def redact(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return _HF_TOKEN_SHAPE.sub(REDACTED, text)


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
        return 128 + signum
    return EXIT_PASS if record.passed else EXIT_FAIL


# --- shared by the attempt and the remote smoke ----------------------------------------------------


def profile_issues(exc: Exception) -> str:
    return "; ".join(str(issue) for issue in getattr(exc, "issues", [])) or str(exc)


def open_results_store(url: str | None) -> Store:
    """The results store, opened before anything starts: a store that cannot be written stops the command
    here (a StoreError naming it), before a model loads, instead of losing the attempt's row at the end."""
    from deploykit.store import open_store

    return open_store(url)


def store_record(record: ResultRecord, store: Store, ui: ConsoleUI) -> tuple[int | None, str]:
    """Add the attempt's row; a store that fails now (disk full, server gone) is a warning, and the verdict
    still prints."""
    from deploykit.store import StoreError

    try:
        return store.add(record), store.display_url
    except StoreError as exc:
        ui.warn(f"the result could not be stored: {exc}")
        return None, store.display_url


def store_record_at(record: ResultRecord, url: str | None, ui: ConsoleUI) -> tuple[int | None, str]:
    """`store_record` for the rows written while serving (corruption, restarts): the store opened at start-up
    was closed once the first verdict was stored, so it is opened again for each row."""
    from deploykit.store import StoreError

    try:
        store = open_results_store(url)
    except StoreError as exc:
        ui.warn(f"the result could not be stored: {exc}")
        return None, url or "the results store"
    try:
        return store_record(record, store, ui)
    finally:
        store.close()


def print_verdict(record: ResultRecord, result_id: int | None, where: str, ui: ConsoleUI) -> None:
    word = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "interrupted": "INTERRUPTED"}[record.verdict]
    ui.say(f"verdict: {word} ({record.stage}): {record.diagnosis}")
    if result_id is not None:
        ui.say(f"result #{result_id} stored in {where}")


def deploykit_version() -> str:
    from deploykit import __version__

    return __version__
