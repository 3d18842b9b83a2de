"""The verdict file (`--verdict-file`): the canary's state as one JSON object, for the pod's exec probes
(`deploykit.render.pod_probe`), which read it from a shared volume instead of depending on the canary's port.

It says when it was written and by which run (`run_id` per canary process, its `pid`, a `sequence` that
grows with every write), so a reader can tell a live canary from a dead one. The path is only ever a regular
file deploykit wrote: a symlink, a device, a FIFO, a directory or a file in another format at that path is
refused (`ForeignVerdictPath`), never replaced — as root, `--verdict-file /dev/null` must not replace the
host's /dev/null.

One canary writes a verdict file: `hold_verdict_file` takes an advisory lock (flock) on `.NAME.lock` beside
it for the canary's life, released by the kernel however the process ends (a crash, SIGKILL). A second
canary on the same file is refused (`VerdictFileHeld`) instead of overwriting the first's verdicts.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

FORMAT = "deploykit-canary-verdict/1"
"""The `format` field of every verdict deploykit writes."""
LEGACY_KEYS = frozenset({"status", "diagnosis", "written_at", "pid"})
"""The keys of a verdict written before `format` existed (replaced, as deploykit's own)."""
MAX_VERDICT_BYTES = 64 * 1024
"""A verdict is a few hundred bytes; anything bigger at the path is not one."""


class ForeignVerdictPath(OSError):
    """Something other than a verdict file deploykit wrote is at the path: it is left alone."""


class VerdictFileHeld(Exception):
    """Another canary holds the verdict file (its lock); `holder` is its pid when the lock file says it."""

    def __init__(self, path: str, holder: int | None) -> None:
        super().__init__(path, holder)
        self.path, self.holder = path, holder


def lock_path(path: str) -> str:
    """The lock file of the verdict file `path`: `.NAME.lock` beside it (the probes never read it)."""
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.lock")


def hold_verdict_file(path: str) -> int:
    """Take the verdict file `path` for this process: an exclusive flock on its lock file, held until the
    returned descriptor is closed or the process ends. Raises VerdictFileHeld when another process holds it;
    OSError when the lock cannot be taken (ForeignVerdictPath: a link or not a regular file there)."""
    where = lock_path(path)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(where, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ForeignVerdictPath(errno.EEXIST, f"{where} is a symbolic link, not a lock file") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ForeignVerdictPath(errno.EEXIST, f"{where} is not a regular file, not a lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise VerdictFileHeld(path, int(text) if text.isascii() and text.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)  # who holds it, for the refusal of the next one
    except BaseException:
        os.close(fd)
        raise
    return fd


def is_own_verdict(data: bytes) -> bool:
    """Whether `data` is a verdict file deploykit wrote (this format, or the one before it)."""
    try:
        verdict = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return False
    if not isinstance(verdict, dict):
        return False
    return verdict.get("format") == FORMAT or set(verdict) == LEGACY_KEYS


def check_replaceable(path: str) -> None:
    """Raise ForeignVerdictPath unless `path` is missing or a regular file holding deploykit's verdict.
    Opened without following a link and without blocking (a FIFO never stalls the canary)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ForeignVerdictPath(errno.EEXIST, f"{path} is a symbolic link, not a verdict file") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a character device"
                if stat.S_ISCHR(mode)
                else "a block device"
                if stat.S_ISBLK(mode)
                else "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a directory"
                if stat.S_ISDIR(mode)
                else "not a regular file"
            )
            raise ForeignVerdictPath(errno.EEXIST, f"{path} is {kind}, not a verdict file")
        data = os.read(fd, MAX_VERDICT_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_VERDICT_BYTES or not is_own_verdict(data):
        raise ForeignVerdictPath(errno.EEXIST, f"{path} holds something other than deploykit's verdict")


def write_verdict_file(path: str | os.PathLike[str], verdict: dict[str, Any]) -> None:
    """Atomically: a temporary file in the same directory (same filesystem), fsynced, then renamed over
    `path`; a reader sees the old verdict or the new one, never half of one. Mode 0644: the probes run in
    the vLLM container, often under another user. Raises ForeignVerdictPath (an OSError) when something
    deploykit did not write is at `path`, OSError for the rest; the temporary file never stays."""
    target = os.fspath(path)
    check_replaceable(target)
    directory, name = os.path.split(os.path.abspath(target))
    fd, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps({"format": FORMAT, **verdict}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            os.fchmod(handle.fileno(), 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_or_warn(
    path: str, verdict: dict[str, Any], last_error: str | None, warn: Callable[[str], None]
) -> str | None:
    """`write_verdict_file`, a failure turned into a warning (once per streak of the same failure), never
    the end of the checking. Returns the failure now (None: written), for the next call's `last_error`."""
    try:
        write_verdict_file(path, verdict)
    except OSError as exc:
        # Without the file names: the temporary file's name changes from one try to the next.
        error = (
            f"refused: {exc.strerror}, left alone"
            if isinstance(exc, ForeignVerdictPath)
            else f"{type(exc).__name__}: {exc.strerror or exc}"
        )
        if error != last_error:
            warn(f"the verdict file {path} could not be written ({error}); the canary goes on")
        return error
    if last_error is not None:
        warn(f"the verdict file {path} is written again")
    return None
