"""The lines of a log a person needs: noise out (interpreter-exit leak reports, progress bars, blank lines).

A vLLM log ends, after the error that matters, with lines that say nothing about it: nanobind's leak
report at interpreter exit (one line per leaked instance, type and function, ~40 with triton), tqdm
progress bars redrawn with carriage returns, blank lines. The traceback and the error line stay.
"""

from __future__ import annotations

import re

SHOWN_ON_FAILURE = 12
"""How many of vLLM's last log lines a failure shows (in its message, its row, on the terminal)."""

_NOISE = (
    re.compile(r"^nanobind: leaked \d+ (instances|types|functions)!"),
    re.compile(r"^\s*- leaked (instance|type|function) "),
    re.compile(r"^\s*- \.\.\. skipped remainder"),
    re.compile(r"^nanobind: this is likely caused by a reference counting issue"),
    # tqdm: "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01, ...]", "12%|█▏  | 3/25"
    re.compile(r"\d+%\s*(Completed\s*)?\|.*\|?\s*\d+/\d+\s*\[[^\]]*\]\s*$"),
)


def is_noise(line: str) -> bool:
    return not line.strip() or any(pattern.search(line) for pattern in _NOISE)


def meaningful_lines(text: str) -> list[str]:
    """The lines of `text` that are not noise; a line redrawn with carriage returns is its last form."""
    lines = [
        line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
        for line in text.split("\n")
    ]
    return [line for line in lines if not is_noise(line)]


def tail(text: str, max_lines: int = SHOWN_ON_FAILURE) -> str:
    """The last `max_lines` meaningful lines of `text` (by default the ones a failure shows)."""
    return "\n".join(meaningful_lines(text)[-max_lines:])
