"""Rows a store could not take when they were made (the server away, the disk full, a read-only copy),
kept until it can: "every attempt writes exactly one row" survives a store that goes away.

A spooled row is one owner-only file (0600, written whole then renamed) named by the row's `row_uuid`, in a
spool directory: beside a SQLite store (`.NAME.spool/`), or for PostgreSQL (and when that directory cannot
be used) under the spool root (`$DEPLOYKIT_SPOOL_DIR`, else the user data directory), one directory per
store. `open_store` writes a store's spooled rows first, oldest first, before the command's own.

The spool trusts only itself (a hostile local user may plant anything in a store's directory):

- a spool directory is used only when it is a real directory (never a symbolic link: opened with
  O_NOFOLLOW, every file in it opened relative to that descriptor), owned by the effective user, with no
  group or other permission bits. Anything else is refused with one line, and never chmod-ed into shape
  (a row for the store goes to the next place);
- a file is read only when it is a regular file of ours (opened with O_NOFOLLOW | O_NONBLOCK: a link is
  never followed, a FIFO never blocks) of at most `MAX_ROW_BYTES`, checked before a byte is read;
- a file that cannot be read, parsed or written is set aside, with one line, into the dead-letter folder
  beside the spool (`.NAME.spool.dead-letter/`, held to the same rules) and never stops another row, the
  command or the canary. Only a store that is away stops a replay (the rest wait for the next command);
- a row is replayed under an exclusive lock on its file (flock), and removed before the lock is let go:
  two processes replaying at once write each row once and each counts only the rows it wrote.

What a replayed row says about fingerprints is evidence, not a verdict: the store judges it again
(`SqlStore.add`, docs/fingerprints.md).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, overload

from deploykit.files import DIR_NO_LINK, make_private_dirs
from deploykit.untrusted_text import terminal_text

if TYPE_CHECKING:
    from deploykit.results.record import ResultRecord
    from deploykit.results.store import Store

SUFFIX = ".row.json"
DEAD_LETTER_SUFFIX = ".dead-letter"
FORMAT = 1
MAX_ROW_BYTES = 16 * 1024 * 1024
"""The largest spool file read. A real row is tens of KiB: a passing `serve` row of the demo profile (facts,
plan, 8 cases, the fingerprint, 60 log lines) measured 17,074 bytes as a spool file (a failed start also
has its last log lines in its diagnosis). 16 MiB is about 1,000 times that and keeps a replay's memory
bounded (a planted 600 MiB file was read whole, then parsed: 2.5 GB)."""

_ROW_NAME = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX))
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_WRITING_PREFIX = ".writing-"


class SpoolError(OSError):
    """No spool directory could take the row."""


class SpoolRefused(SpoolError):
    """A spool directory this process does not trust; the message is the one line that says why."""


@dataclass(frozen=True)
class Spooled:
    """Where a row was kept, and the spool directories passed over first (one line each)."""

    path: Path
    refused: list[str] = field(default_factory=list)


def spool_dirs(store_url: str) -> list[Path]:
    """Where rows for the store at `store_url` are kept, in the order tried: beside a SQLite file, then
    the spool root's directory for this store."""
    from deploykit.results.urls import display_url, normalise_url

    places: list[Path] = []
    normalised = normalise_url(store_url)
    if normalised.startswith("sqlite:///"):
        from sqlalchemy.engine import make_url

        database = make_url(normalised).database or ""
        if database:
            path = Path(database)
            places.append(path.parent / f".{path.name}.spool")
    try:
        from deploykit.paths import default_spool_root

        key = hashlib.sha256(display_url(store_url).encode()).hexdigest()[:16]
        places.append(default_spool_root() / key)
    except Exception:  # no platformdirs (the vLLM image) and no $DEPLOYKIT_SPOOL_DIR: beside only
        pass
    return places


def dead_letter_dir(spool: Path) -> Path:
    """Where the files of `spool` that cannot be replayed are set aside: beside it."""
    return spool.with_name(spool.name + DEAD_LETTER_SUFFIX)


def keep(record: ResultRecord, store_url: str) -> Spooled:
    """Spool `record` for the store at `store_url`. SpoolError when no place can take it."""
    if record.row_uuid is None:
        record.row_uuid = uuid.uuid4().hex
    content = json.dumps(
        {"format": FORMAT, "record": record.model_dump(mode="json")}, separators=(",", ":")
    ).encode()
    name = f"{record.row_uuid}{SUFFIX}"
    refused: list[str] = []
    problems: list[str] = []
    for directory in spool_dirs(store_url):
        try:
            dir_fd = _trusted_dir(directory, create=True)
        except SpoolRefused as exc:
            refused.append(str(exc))
            problems.append(str(exc))
            continue
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror or exc}")
            continue
        try:
            _write_whole(dir_fd, name, content)
        except OSError as exc:
            problems.append(f"{directory}: {exc.strerror or exc}")
            continue
        finally:
            os.close(dir_fd)
        return Spooled(directory / name, refused)
    raise SpoolError("; ".join(problems) or "no spool directory (set $DEPLOYKIT_SPOOL_DIR)")


def pending(store_url: str) -> list[Path]:
    """The rows spooled for the store at `store_url` in the spool directories it trusts, oldest first."""
    found: list[tuple[float, str, Path]] = []
    for directory in spool_dirs(store_url):
        try:
            dir_fd = _trusted_dir(directory, create=False)
        except OSError:
            continue
        if dir_fd is None:
            continue
        try:
            found += [(mtime, name, directory / name) for mtime, name in _rows_in(dir_fd)]
        finally:
            os.close(dir_fd)
    return [path for _, _, path in sorted(found)]


def replay(store: Store, warn: Callable[[str], None] | None = None) -> int:
    """Write the rows spooled for `store`, oldest first; returns how many this process wrote and removed
    from the spool. A store that fails meanwhile stops the replay (the rest stay for the next command); a
    spool directory it does not trust, and each file it cannot replay, is one `warn` line (default: on
    stderr), and the replay goes on. Never raises for what it finds in the spool."""
    say = warn or _on_stderr
    opened: list[tuple[Path, int]] = []
    try:
        for directory in spool_dirs(store.url):
            try:
                dir_fd = _trusted_dir(directory, create=False)
            except SpoolRefused as exc:
                say(str(exc))
                continue
            except OSError as exc:
                say(f"the spool {directory} cannot be opened ({exc.strerror or exc}): its rows wait")
                continue
            if dir_fd is not None:
                opened.append((directory, dir_fd))
        rows: list[tuple[float, str, Path, int]] = []
        for directory, dir_fd in opened:
            try:
                rows += [(mtime, name, directory, dir_fd) for mtime, name in _rows_in(dir_fd)]
            except OSError as exc:
                say(f"the spool {directory} cannot be listed ({exc.strerror or exc}): its rows wait")
        written = 0
        for _, name, directory, dir_fd in sorted(rows, key=lambda row: row[:2]):
            outcome = _replay_one(store, directory, dir_fd, name, say)
            if outcome == "stop":
                break
            written += outcome == "written"
        return written
    finally:
        for _, dir_fd in opened:
            os.close(dir_fd)


# --- the directories ---------------------------------------------------------------------------------


@overload
def _trusted_dir(directory: Path, *, create: Literal[True]) -> int: ...
@overload
def _trusted_dir(directory: Path, *, create: Literal[False]) -> int | None: ...
def _trusted_dir(directory: Path, *, create: bool) -> int | None:
    """`directory` opened (a descriptor the caller closes) when it is a spool this process may trust: a
    directory, not a link, owned by the effective user, no group or other bits. `create`: made 0700 when
    missing (its parents too); else None when missing. SpoolRefused (one line) for anything else."""
    if create:
        make_private_dirs(directory.parent)
    try:
        parent_fd = os.open(directory.parent, os.O_RDONLY | os.O_DIRECTORY | _CLOEXEC)
    except FileNotFoundError:
        if create:
            raise
        return None  # no spool root yet: nothing spooled
    try:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory.name, 0o700, dir_fd=parent_fd)
        try:
            dir_fd = os.open(directory.name, DIR_NO_LINK, dir_fd=parent_fd)
        except FileNotFoundError:
            if create:
                raise
            return None
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            found = os.stat(directory.name, dir_fd=parent_fd, follow_symlinks=False)
            raise _refused(directory, _kind_of(found.st_mode, "is not a directory")) from None
    finally:
        os.close(parent_fd)
    info = os.fstat(dir_fd)
    euid = os.geteuid()
    why = (
        f"belongs to uid {info.st_uid}, not to this user (uid {euid})"
        if info.st_uid != euid
        else f"is open to other users (mode {stat.S_IMODE(info.st_mode):04o})"
        if info.st_mode & 0o077
        else ""
    )
    if why:
        os.close(dir_fd)
        raise _refused(directory, why)
    return dir_fd


def _refused(directory: Path, why: str) -> SpoolRefused:
    return SpoolRefused(
        f"the spool {directory} {why}: not used (deploykit keeps rows only in a directory of its own, "
        "mode 0700, never through a link); remove it"
    )


def _rows_in(dir_fd: int) -> list[tuple[float, str]]:
    """The spooled rows' names in the directory, with their times (never following a link)."""
    rows: list[tuple[float, str]] = []
    for name in os.listdir(dir_fd):
        if not _ROW_NAME.fullmatch(name):
            continue  # a temporary file being written, or nothing of ours
        try:
            rows.append((os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime, name))
        except FileNotFoundError:
            continue  # replayed by another process meanwhile
    return rows


def _write_whole(dir_fd: int, name: str, content: bytes) -> None:
    """`content` as the owner-only file `name` in the directory, whole (written beside it, then renamed
    over it): a reader sees no file or all of it."""
    temp = f"{_WRITING_PREFIX}{secrets.token_hex(6)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


# --- one file ------------------------------------------------------------------------------------------


class _Unreplayable(Exception):
    """A spool file that is not a row this deploykit can replay; the message says why, in a few words."""


def _replay_one(
    store: Store, directory: Path, dir_fd: int, name: str, say: Callable[[str], None]
) -> Literal["written", "skipped", "stop"]:
    """One spool file into the store, under an exclusive lock on it; set aside (one line) when it is not a
    row that can be written; "stop" when the store is away."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISREG(found.st_mode):  # a link or a device is never opened
            raise _Unreplayable(_kind_of(found.st_mode))
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return "skipped"  # replayed by another process meanwhile
    except _Unreplayable as exc:
        _set_aside(directory, dir_fd, name, str(exc), say)
        return "skipped"
    except OSError as exc:
        why = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
        _set_aside(directory, dir_fd, name, why, say)
        return "skipped"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return "skipped"  # another process is writing it now
        info = os.fstat(fd)
        if info.st_nlink == 0:
            return "skipped"  # written and removed by another process before this one had the lock
        try:
            record = _read_row(fd, info, name)
        except _Unreplayable as exc:
            _set_aside(directory, dir_fd, name, str(exc), say)
            return "skipped"
        outcome = _write(store, record)
        if outcome == "stop":
            return "stop"
        if outcome:
            _set_aside(directory, dir_fd, name, outcome, say)
            return "skipped"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return "written"
    finally:
        os.close(fd)  # the lock goes with it, after the file left the spool


def _kind_of(mode: int, otherwise: str = "is not a regular file") -> str:
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if stat.S_ISFIFO(mode):
        return "is a FIFO, not a file"
    return otherwise


def _read_row(fd: int, info: os.stat_result, name: str) -> ResultRecord:
    """The record in the open spool file, its size and owner checked before a byte is read."""
    from pydantic import ValidationError

    from deploykit.results.record import ResultRecord

    if not stat.S_ISREG(info.st_mode):
        raise _Unreplayable(_kind_of(info.st_mode))
    if info.st_uid != os.geteuid():
        raise _Unreplayable(f"belongs to uid {info.st_uid}, not to this user")
    if info.st_size > MAX_ROW_BYTES:
        raise _Unreplayable(f"is {info.st_size} bytes, more than a row may be ({MAX_ROW_BYTES})")
    chunks: list[bytes] = []
    size = 0
    while size <= MAX_ROW_BYTES and (chunk := os.read(fd, 1 << 20)):
        chunks.append(chunk)
        size += len(chunk)
    if size > MAX_ROW_BYTES:
        raise _Unreplayable(f"grew past what a row may be ({MAX_ROW_BYTES} bytes) while read")
    try:
        data = json.loads(b"".join(chunks))
        if not isinstance(data, dict) or not isinstance(data.get("record"), dict):
            raise _Unreplayable("is not a spooled row (no `record`)")
        record = ResultRecord.model_validate(data["record"])
    except RecursionError:
        raise _Unreplayable("nests deeper than any row does") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the row"
        raise _Unreplayable(f"is not a row this deploykit reads ({where}: {_shown(first['msg'])})") from None
    except ValueError as exc:
        raise _Unreplayable(f"is not JSON ({_shown(str(exc))})") from None
    if record.row_uuid is None:
        record.row_uuid = name.removesuffix(SUFFIX)
    return record


def _write(store: Store, record: ResultRecord) -> str:
    """The record into the store: "" when written, "stop" when the store is away, else why it never can be."""
    from deploykit.errors import StoreError

    try:
        store.add(record)
    except StoreError as exc:
        return "stop" if exc.spoolable else f"is refused by the store ({_shown(str(exc))})"
    except Exception as exc:  # a row this deploykit fails on must not stop the rows after it, nor the command
        return f"could not be written ({type(exc).__name__}: {_shown(str(exc))})"
    return ""


def _set_aside(directory: Path, dir_fd: int, name: str, why: str, say: Callable[[str], None]) -> None:
    """Move the file into the dead-letter folder beside the spool (or, when that cannot be trusted, to
    NAME.unreadable in the spool, which no replay reads); one line either way."""
    dead = dead_letter_dir(directory)
    where = f"{dead}/"
    try:
        dead_fd = _trusted_dir(dead, create=True)
        try:
            os.rename(name, name, src_dir_fd=dir_fd, dst_dir_fd=dead_fd)
        finally:
            os.close(dead_fd)
    except OSError as exc:
        instead = f"{name}.unreadable"
        try:
            os.rename(name, instead, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as last:
            failed = last.strerror or last
            say(f"the spooled row {directory / name} {why}, and cannot be set aside ({failed}): skipped")
            return
        reason = str(exc) if isinstance(exc, SpoolRefused) else f"{dead}: {exc.strerror or exc}"
        where = f"{directory / instead} ({reason})"
    say(f"the spooled row {directory / name} {why}: set aside in {where}, for a person to read")


def _shown(text: str) -> str:
    """Text from a file or a driver on one line, every character a terminal would act on escaped."""
    return terminal_text(" ".join(text.split())[:300])


def _on_stderr(line: str) -> None:
    print(f"deploykit: {line}", file=sys.stderr)
