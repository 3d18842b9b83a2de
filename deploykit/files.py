"""Every file deploykit writes goes through here: never through a symbolic link, owner-only where it holds
results or logs, and a rendered set all at once.

- `write_set(out_dir, files, force=...)`: a render's files. Each is written to a temporary directory inside
  `out_dir` first and moved into place only when all of them are written, so a failure halfway leaves the
  old set (or nothing), never half a unit set. Directories inside `out_dir` are opened with O_NOFOLLOW and
  files replaced by rename relative to them: a link planted in `--out` (`out/P.yaml → /etc/x`) is refused,
  never followed. A manifest (`.deploykit-render.json`) records the sha256 of each file written; a file
  whose content no longer matches it (a person edited it), or that deploykit did not write, is not
  overwritten unless `force`. A secrets file (`keep=True`: `P.env.example`) that exists is never
  overwritten, not even with `force`: it may hold the filled-in secrets. The manifest also records whose
  set each file is of (`OutFile.owner`: the profile): a file of another owner's set is never written over,
  not even with `force` (profiles `x.y` and `x_y` make one chart name, `x-y`: the second is refused).
- `make_private_dirs`, `open_private` and `replace_private`: owner-only directories (0700) and files
  (0600) for the results store, logs and trace output, created with O_NOFOLLOW | O_EXCL semantics so an
  existing link is never followed to create or truncate its target.

Standard library only: the sidecars (`deploykit canary --verdict-file`) run in the vLLM image.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Literal

MANIFEST_NAME = ".deploykit-render.json"
_TEMP_PREFIX = ".deploykit-writing-"
DIR_NO_LINK = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
"""os.open flags for a directory that must not be reached through a symbolic link (ELOOP if it is one)."""


class WriteRefused(Exception):
    """A file was not written; the message names it and the way out (one line)."""


@dataclass(frozen=True)
class OutFile:
    """One file of a set: its path relative to the output directory, its bytes and mode. `keep`: a file a
    person fills in (secrets): once it exists it is theirs, and deploykit never overwrites it. `owner`: whose
    set it is of (a profile's name; None: a file every set holds alike)."""

    path: str
    content: bytes
    mode: int = 0o644
    keep: bool = False
    owner: str | None = None


@dataclass
class SetWritten:
    """What `write_set` did: the paths written, and the kept files (with why) it left alone."""

    written: list[Path] = field(default_factory=list)
    kept: list[tuple[Path, str]] = field(default_factory=list)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _parts(relative: str) -> tuple[str, ...]:
    """The path's parts, refusing anything that leaves the output directory."""
    pure = PurePosixPath(relative)
    if pure.is_absolute() or not pure.parts or any(p in ("", ".", "..") for p in pure.parts):
        raise WriteRefused(f"{relative!r} is not a path inside the output directory")
    return pure.parts


def _open_dir(name: str, parent_fd: int, where: Path, created: list[tuple[int, str]]) -> int:
    """The directory `name` below `parent_fd`, opened without following a link; created 0755 when missing
    (and noted in `created`, so a failed set removes it again)."""
    try:
        return os.open(name, DIR_NO_LINK, dir_fd=parent_fd)
    except FileNotFoundError:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
        created.append((parent_fd, name))
        return os.open(name, DIR_NO_LINK, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise WriteRefused(
                f"{where / name} is a symbolic link or not a directory: deploykit never writes through a "
                "link; remove it or choose another --out"
            ) from None
        raise


def _existing(name: str, dir_fd: int, where: Path) -> bytes | None:
    """The bytes of the regular file `name` in `dir_fd` (None when there is none); a link or anything
    but a regular file is refused."""
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        raise WriteRefused(
            f"{where / name} is a symbolic link: deploykit never writes through a link (it could point "
            "anywhere, /etc included); remove it, or choose another --out"
        )
    if not stat.S_ISREG(info.st_mode):
        raise WriteRefused(f"{where / name} is not a regular file; remove it or choose another --out")
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as handle:
        return handle.read()


def _read_manifest(out_fd: int) -> tuple[dict[str, str], dict[str, str]]:
    """(path -> sha256 written, path -> owner) from the manifest; empty where it cannot be read."""
    try:
        raw = _existing(MANIFEST_NAME, out_fd, Path("."))
        data = json.loads(raw or b"{}")
    except (WriteRefused, ValueError, OSError, RecursionError):
        return {}, {}
    tables = [data.get(key) if isinstance(data, dict) else None for key in ("files", "owners")]
    files, owners = ({str(k): str(v) for k, v in t.items()} if isinstance(t, dict) else {} for t in tables)
    return files, owners


def _other_owner(item: OutFile, owners: dict[str, str], target: Path) -> WriteRefused | None:
    """The refusal when `item`'s path is recorded as a file of another owner's set (None: it is not)."""
    recorded = owners.get(item.path)
    if item.owner is None or recorded is None or recorded == item.owner:
        return None
    return WriteRefused(
        f"{target} was rendered for profile {recorded[:100]!r}, not {item.owner!r}: two profiles never write "
        "one file (their names make one chart or unit name); render into another --out, or remove it"
    )


def write_set(out_dir: Path, files: Sequence[OutFile], *, force: bool = False) -> SetWritten:
    """Write `files` below `out_dir` as one set (see the module docstring). Raises WriteRefused, before any
    file changes, for a link in the way, a file a person changed (without `force`), or a path outside
    `out_dir`; OSError for the file system's own refusals (also before any file changes, except a
    failure while renaming the finished files into place)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out_fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    opened: dict[tuple[str, ...], int] = {(): out_fd}
    created: list[tuple[int, str]] = []
    done = False
    try:
        manifest, owners = _read_manifest(out_fd)
        plan: list[tuple[OutFile, int, str, Path]] = []  # (file, its directory's fd, name, full path)
        result = SetWritten()
        for item in files:
            *directories, name = _parts(item.path)
            where = out_dir
            for depth in range(len(directories)):
                key = tuple(directories[: depth + 1])
                if key not in opened:
                    opened[key] = _open_dir(directories[depth], opened[key[:-1]], where, created)
                where = where / directories[depth]
            dir_fd = opened[tuple(directories)]
            current = _existing(name, dir_fd, where)
            target = where / name
            if current is not None and (refused := _other_owner(item, owners, target)) is not None:
                raise refused
            if current is not None and current != item.content:
                if item.keep:
                    result.kept.append((target, "it exists and may hold filled-in secrets: kept as it is"))
                    continue
                recorded = manifest.get(item.path)
                if not force and recorded != sha256(current):
                    why = (
                        "was changed since deploykit wrote it" if recorded else "was not written by deploykit"
                    )
                    raise WriteRefused(
                        f"{target} {why}: not overwritten; pass --force to replace it, or another --out"
                    )
            plan.append((item, dir_fd, name, target))
        for item, *_ in plan:
            if item.owner is None:
                owners.pop(item.path, None)
            else:
                owners[item.path] = item.owner
        _write_all(out_fd, plan, manifest | {f.path: sha256(f.content) for f, *_ in plan}, owners)
        result.written = [target for _, _, _, target in plan]
        done = True
        return result
    finally:
        for parent_fd, name in reversed(created if not done else []):
            with contextlib.suppress(OSError):  # only while still empty
                os.rmdir(name, dir_fd=parent_fd)
        for fd in opened.values():
            os.close(fd)


_OWN_DEBRIS = re.compile(rf"^{re.escape(_TEMP_PREFIX)}(?:(\d+)-)?[0-9a-f]{{12}}$")
_OLD_DEBRIS_S = 600.0  # a temporary directory of a release that did not name its process: this old is left


def _clean_debris(out_fd: int) -> None:
    """Remove what an earlier render killed mid-write left in `out_dir`: its temporary directory
    (`.deploykit-writing-PID-HEX`, PID no longer running; one of an older release once it is 10 minutes
    old). Only plain files inside are removed, never through a link; another render's live one is left."""
    for name in os.listdir(out_fd):
        found = _OWN_DEBRIS.match(name)
        if found is None:
            continue
        try:
            info = os.stat(name, dir_fd=out_fd, follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            continue
        if found.group(1) is not None:
            if process_exists(int(found.group(1))):
                continue
        elif time.time() - info.st_mtime < _OLD_DEBRIS_S:
            continue
        with contextlib.suppress(OSError):
            debris_fd = os.open(name, DIR_NO_LINK, dir_fd=out_fd)
            try:
                for leftover in os.listdir(debris_fd):
                    with contextlib.suppress(OSError):
                        os.unlink(leftover, dir_fd=debris_fd)
            finally:
                os.close(debris_fd)
            os.rmdir(name, dir_fd=out_fd)


def process_exists(pid: int) -> bool:
    """Whether a process with this id lives (another user's counts), so its leftovers are not yet debris."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != 0


def _write_all(
    out_fd: int,
    plan: list[tuple[OutFile, int, str, Path]],
    manifest: dict[str, str],
    owners: dict[str, str],
) -> None:
    """Every file into a temporary directory in `out_dir` (same file system), fsynced; then each renamed
    into place, the manifest last. Any failure before the renames leaves every target as it was. The
    directory's name carries this process's id: a later render removes it if this one is killed."""
    _clean_debris(out_fd)
    temp_name = f"{_TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
    os.mkdir(temp_name, 0o700, dir_fd=out_fd)
    temp_fd = os.open(temp_name, DIR_NO_LINK, dir_fd=out_fd)
    staged: list[str] = []
    try:
        manifest_file = OutFile(
            MANIFEST_NAME,
            (json.dumps({"files": manifest, "owners": owners}, indent=2, sort_keys=True) + "\n").encode(),
        )
        for index, item in enumerate([*(entry[0] for entry in plan), manifest_file]):
            staged_name = str(index)
            _write_new(staged_name, temp_fd, item.content, item.mode)
            staged.append(staged_name)
        for staged_name, (_, dir_fd, name, _) in zip(staged, plan, strict=False):
            os.replace(staged_name, name, src_dir_fd=temp_fd, dst_dir_fd=dir_fd)
        os.replace(staged[-1], MANIFEST_NAME, src_dir_fd=temp_fd, dst_dir_fd=out_fd)
    finally:
        for leftover in os.listdir(temp_fd):
            with contextlib.suppress(OSError):
                os.unlink(leftover, dir_fd=temp_fd)
        os.close(temp_fd)
        with contextlib.suppress(OSError):
            os.rmdir(temp_name, dir_fd=out_fd)


def _write_new(name: str, dir_fd: int, content: bytes, mode: int) -> None:
    """A new file with its final mode from its first byte (a secrets file is never briefly readable)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)  # the umask may have taken bits away
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


# --- owner-only files: results, logs, traces --------------------------------------------------------


def make_private_dirs(directory: Path) -> None:
    """Create `directory` and any missing parents as 0700 (results and logs are the owner's alone);
    directories that exist already keep their mode."""
    missing = [d for d in [directory, *directory.parents] if not d.exists() and not d.is_symlink()]
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
    if directory.is_symlink() and not directory.is_dir():
        raise WriteRefused(f"{directory} is a dangling symbolic link: remove it or choose another directory")


def open_private(path: Path, how: Literal["append", "truncate"] = "append") -> IO[bytes]:
    """`path` opened for writing as an owner-only (0600) file, created if missing. A symbolic link at
    `path` is refused (never followed to create or truncate its target): ELOOP as a WriteRefused."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if how == "append" else os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise WriteRefused(f"{path} is a symbolic link: deploykit never writes through a link") from None
        raise
    return os.fdopen(fd, "ab" if how == "append" else "wb")


def create_private_file(path: Path) -> None:
    """Create `path` as 0600 unless something is there already (then it is left as it is); a dangling
    link at `path` is never followed to create its target elsewhere."""
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def replace_private(path: Path, content: bytes, mode: int = 0o600) -> None:
    """Replace `path`'s content at once (a reader sees the old file or the new one, never half): written
    beside it, then renamed over it. A link at `path` is replaced by the file, never followed."""
    directory = path.parent
    temp = directory / f"{_TEMP_PREFIX}{path.name}.{secrets.token_hex(4)}"
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
    try:
        _write_new(temp.name, dir_fd, content, mode)
        os.replace(temp.name, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp.name, dir_fd=dir_fd)
        raise
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def private_append(path: Path) -> Iterator[IO[bytes]]:
    """`open_private(path)` as a context manager, parents created 0700 first."""
    make_private_dirs(path.parent)
    with open_private(path) as handle:
        yield handle
