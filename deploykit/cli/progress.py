"""A command that goes quiet for more than a second says what it is doing: one line on stderr."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import typer

NOTICE_AFTER_S = 1.0


@contextlib.contextmanager
def say_if_slow(message: str, after_s: float = NOTICE_AFTER_S) -> Iterator[None]:
    """`message` on stderr once the block has run `after_s` seconds; a quick block prints nothing.

    A timer, not a line up front: the usual run is fast and its stderr stays empty. The message starts
    with `deploykit` like every line deploykit writes to stderr (tests/cli/test_quiet.py)."""
    timer = threading.Timer(after_s, typer.echo, args=(message,), kwargs={"err": True})
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
