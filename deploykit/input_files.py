"""Reading a file a person names (a profile, a facts file): the one safe way, so no input can hang,
exhaust memory or crash deploykit with a traceback.

- Regular files only: a FIFO is opened without blocking and refused, a device such as /dev/zero refused
  before a byte is read.
- Size bounded: a few MiB is far beyond any real profile or probe.
- YAML without aliases (a billion-laughs alias bomb expands exponentially; a profile never needs one)
  and with bounded nesting (the composer recurses per level: 20,000 levels is a RecursionError).
- JSON with bounded nesting, checked before the parser recurses.

Errors are `InputFileError` with a one-line reason; the caller turns it into its own error family
(ProfileError, FactsError) naming the file and the way out.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_INPUT_BYTES = 4 * 1024 * 1024
"""The largest profile or facts file read: a real one is a few KiB."""

MAX_NESTING = 64
"""The deepest nesting of mappings and lists accepted: a real profile is 4 levels deep."""


class InputFileError(Exception):
    """A file cannot be read safely; `reason` is one line, `line`/`column` where known (1-based)."""

    def __init__(self, reason: str, line: int = 1, column: int = 1) -> None:
        super().__init__(reason)
        self.reason, self.line, self.column = reason, line, column


def read_text(path: Path | str, *, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of a regular file, at most `max_bytes`. Raises FileNotFoundError when it is missing
    (callers say where they looked) and InputFileError for everything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise InputFileError(f"cannot read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"not a regular file ({_kind(info.st_mode)}): give a file")
        if info.st_size > max_bytes:
            raise InputFileError(f"{info.st_size} bytes is too large (at most {max_bytes})")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(max_bytes + 1)
    except OSError as exc:
        reason = "is a directory" if exc.errno == errno.EISDIR else (exc.strerror or str(exc))
        raise InputFileError(f"cannot read: {reason}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:  # it grew while being read
        raise InputFileError(f"more than {max_bytes} bytes is too large")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a plain file"


class _Refused(yaml.MarkedYAMLError):
    """Valid YAML that deploykit will not compose (an alias, too deep a nesting)."""


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and nesting deeper than MAX_NESTING, at the event that shows it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def _next_event(self) -> Any:
        return self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML is untyped

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self._next_event()
            raise _Refused(
                None,
                None,
                f"YAML alias *{event.anchor} is not allowed (write the value out; aliases can expand without "
                "bound)",
                event.start_mark,
            )
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                raise _Refused(
                    None, None, f"YAML nested deeper than {MAX_NESTING} levels", self._next_event().start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def compose_yaml(text: str) -> yaml.Node | None:
    """The YAML node tree of `text` (None when it holds no document), aliases refused and nesting bounded.
    Raises InputFileError with the line and column of the problem."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = " ".join(p for p in (exc.context, exc.problem) if p)
        prefix = "" if isinstance(exc, _Refused) else "YAML syntax error: "
        raise InputFileError(f"{prefix}{problem}", line, column) from None
    except yaml.YAMLError as exc:
        raise InputFileError(f"YAML error: {exc}") from None
    finally:
        loader.dispose()


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_nesting(text: str) -> int:
    """How deep `text`'s brackets nest (strings skipped): checked before json.loads recurses."""
    depth = deepest = 0
    for match in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if match.group() in "[{" else -1
        deepest = max(deepest, depth)
    return deepest


def parse_json(text: str) -> Any:
    """`json.loads(text)` with nesting bounded by MAX_NESTING; InputFileError when it is not JSON."""
    if json_nesting(text) > MAX_NESTING:
        raise InputFileError(f"not JSON this deploykit reads: nested deeper than {MAX_NESTING} levels")
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InputFileError(f"not JSON ({exc})") from None
    except RecursionError:  # unbalanced brackets can fool the count above
        raise InputFileError(f"not JSON this deploykit reads: nested deeper than {MAX_NESTING}") from None
