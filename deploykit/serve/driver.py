"""The one attempt driver: every command that stores a row per attempt (`serve`, its restarts in serving
mode, `smoke --url`, `trace`) runs its stages through `drive`, and ends it with `finish`.

Modelled on pytest's `CallInfo.from_call`: the stage is data (`Stage`), the body moves from one to the
next with `StageClock.enter` (each stage timed into the row as `stage_NAME_s`), and one place catches
whatever ends the body: a `StageFailure` (the stage it names), a signal deploykit forwards (SIGINT/SIGTERM
raise `Interrupted` while the gate is armed; one swallowed by a library still counts, the gate remembers
it), Ctrl-C, a `DeploykitError` (a missing package, say) or any other exception. Each becomes the
attempt's verdict and diagnosis; the row is then written once by `finish` (spooled when the store is away,
deploykit.results.spool) and the verdict printed once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from deploykit import exit_codes
from deploykit.errors import DeploykitError
from deploykit.serve.signals import Interrupted, SignalGate

if TYPE_CHECKING:
    from deploykit.results.record import ResultRecord, Verdict
    from deploykit.results.store import Store


class Stage(StrEnum):
    """Where an attempt is (and, in its row, where it ended). Each name is written here once."""

    PROFILE = "profile"
    CASES = "cases"
    PROBE = "probe"
    PLAN = "plan"
    PORT = "port"
    SECRETS = "secrets"
    MODEL = "model"
    LAUNCH = "launch"
    STARTUP = "startup"
    SMOKE = "smoke"
    REQUESTS = "requests"
    STOP = "stop"
    REPORT = "report"
    CORRUPTION = "corruption"
    DONE = "done"


INPUT_STAGES = frozenset({Stage.PROFILE, Stage.CASES, Stage.PLAN})
"""An attempt that ends at one of these was refused for its input: nothing ran (`trace` exits USAGE)."""


class Tracked(Protocol):
    """What a stage clock writes to: an `Attempt` or a `ResultRecord`."""

    stage: str
    timings: dict[str, float | None]


class StageFailure(DeploykitError):
    """An attempt ended before a verdict; `stage` says where (`profile`, `plan`, `port`, `secrets`, `model`,
    `launch`, `startup`, ...). The attempt's row carries the message."""

    exit_code = exit_codes.FAILED

    def __init__(self, stage: str | Stage, message: str) -> None:
        super().__init__(message)
        self.stage = str(stage)


@dataclass
class StageClock:
    """The attempt's current stage, and how long each stage it left took (`stage_NAME_s` in its timings)."""

    target: Tracked
    started: float = field(default_factory=time.monotonic)
    since: float = field(default_factory=time.monotonic)

    @property
    def stage(self) -> str:
        return self.target.stage

    def enter(self, stage: Stage) -> None:
        self._time_current()
        self.target.stage = stage.value

    def fail_at(self, stage: str) -> None:
        """A `StageFailure` named its own stage (a check of the plan's inside `smoke`, say)."""
        self._time_current()
        self.target.stage = str(stage)

    def close(self) -> None:
        self._time_current()

    def _time_current(self) -> None:
        now = time.monotonic()
        key = f"stage_{self.target.stage}_s"
        self.target.timings[key] = round((self.target.timings.get(key) or 0.0) + now - self.since, 4)
        self.since = now


@dataclass
class Outcome:
    """How an attempt's stages ended: `pass`/`fail` as the body judged them; `error` (a failed stage or any
    exception) and `interrupted` (a signal) are the driver's."""

    verdict: Verdict = "error"
    diagnosis: str = ""
    interrupted: Interrupted | None = None
    exit_code: int | None = None
    """A DeploykitError's own exit code, or USAGE for an input stage; None: the verdict's."""
    error: DeploykitError | None = None
    """A DeploykitError other than a stage's (a missing package, say): after its row, the command raises it
    again so the CLI prints its one `deploykit: ...` line."""


def drive(
    clock: StageClock,
    body: Callable[[], tuple[Verdict, str]],
    *,
    gate: SignalGate | None = None,
    context: str = "",
    usage_stages: frozenset[Stage] = frozenset(),
) -> Outcome:
    """Run `body` (it returns its verdict, `pass` or `fail`, and diagnosis) and say how it ended; never
    raises an Exception (BaseExceptions other than Ctrl-C, such as SystemExit, pass). On return the gate is
    disarmed: the cleanup and the row are not interrupted by a second signal."""
    outcome = Outcome()
    try:
        outcome.verdict, outcome.diagnosis = body()
        if gate is not None and gate.received is not None:  # a library swallowed the Interrupted
            raise Interrupted(gate.received)
        clock.enter(Stage.DONE)
    except Interrupted as exc:
        _interrupted(outcome, clock, exc, context)
    except KeyboardInterrupt:
        _interrupted(outcome, clock, Interrupted(signal.SIGINT), context)
    except Exception as exc:
        if gate is not None and gate.received is not None:
            _interrupted(outcome, clock, Interrupted(gate.received), context)
        elif isinstance(exc, StageFailure):
            clock.fail_at(exc.stage)
            outcome.verdict, outcome.diagnosis = "error", str(exc)
            if exc.stage in usage_stages:
                outcome.exit_code = exit_codes.USAGE
        elif isinstance(exc, DeploykitError):
            outcome.verdict, outcome.diagnosis, outcome.exit_code = "error", exc.message, exc.exit_code
            outcome.error = exc
        else:
            outcome.verdict, outcome.diagnosis = "error", f"{type(exc).__name__}: {exc}"
    finally:
        if gate is not None:
            gate.armed = False
        clock.close()
    return outcome


def _interrupted(outcome: Outcome, clock: StageClock, exc: Interrupted, context: str) -> None:
    outcome.verdict, outcome.interrupted = "interrupted", exc
    outcome.diagnosis = f"stopped by {signal.Signals(exc.signum).name} during {clock.stage}{context}"
    clock.target.timings["signal"] = float(exc.signum)


# --- the row ---------------------------------------------------------------------------------------------


def finish(
    record: ResultRecord,
    store: Store | str | None,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    *,
    keep: bool = True,
    brief: bool = False,
) -> int | None:
    """The attempt's one row stored (or spooled when the store is away: deploykit.results.store_row) and its
    verdict printed once; returns the row's id (None when spooled or not kept). `keep=False`: `--no-store`.
    `brief`: the diagnosis's first line only (`trace` prints its whole report itself)."""
    from deploykit.results.store_row import store_row

    result_id, where = store_row(record, store, warn) if keep else (None, "")
    for line in verdict_lines(record, result_id, where, brief=brief):
        say(line)
    return result_id


def verdict_lines(
    record: ResultRecord, result_id: int | None, where: str, *, brief: bool = False
) -> list[str]:
    """`verdict: WORD (stage): diagnosis`, and where the row went."""
    word = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "interrupted": "INTERRUPTED"}[record.verdict]
    diagnosis = record.diagnosis.splitlines()[0] if brief and record.diagnosis else record.diagnosis
    lines = [f"verdict: {word} ({record.stage}): {diagnosis}"]
    if result_id is not None:
        lines.append(f"result #{result_id} stored in {where}")
    return lines


def exit_code(record: ResultRecord, outcome: Outcome, gate: SignalGate | None = None) -> int:
    """The process exit status the verdict says: 0 pass, 1 fail/error (or the error's own code), 128+N for
    signal N (also when it came after the verdict, during the cleanup or the row)."""
    if record.verdict == "interrupted":
        return exit_codes.for_signal(int(record.timings.get("signal") or signal.SIGTERM))
    if gate is not None and gate.received is not None:
        return exit_codes.for_signal(gate.received)
    if record.verdict == "pass":
        return exit_codes.OK
    return outcome.exit_code if outcome.exit_code is not None else exit_codes.FAILED
